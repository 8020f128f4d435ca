-- Argo CD health check for eopipe.dev/ExactlyOncePipeline.
-- Install: argocd/README.md (argocd-cm resource.customizations.health.eopipe.dev_ExactlyOncePipeline).
-- Reads what the operator writes (operator/eopipe/control/status.py): status.observedGeneration,
-- status.conditions (Ready, Reconciling, Stalled, TopicsReady, DedupReady, ProcessingReady),
-- status.phase and, while partitions move, status.rebalance. Lua 5.1 (Argo CD's gopher-lua).
--
--   Progressing  no status yet, or generation not observed yet (checked first: conditions
--                of an older generation say nothing about the current spec)
--   Degraded     Stalled=True (InvalidSpec, NotSupported, Conflict), or Ready or a stage
--                condition False with a failure reason: SparkFailed, SparkOperatorMissing,
--                KafkaUnavailable, ApplyFailed, HangingTransaction, AdoptedTopicMismatch,
--                LagGrowing, PolicyDenied, SparkStuck, CheckpointUnreachable,
--                DriverNodeLost
--   Suspended    spec.paused and the operator has acted on it
--   Progressing  a rebalance running, Reconciling=True, or Ready=False for another reason
--   Healthy      Ready=True for the current generation, nothing moving

local FAILURE_REASONS = {
  InvalidSpec = true,          -- the spec cannot be reconciled; fix the manifest
  NotSupported = true,         -- e.g. a partition decrease: Kafka cannot do it
  SparkFailed = true,          -- the Spark application failed (it restarts OnFailure)
  SparkOperatorMissing = true, -- no SparkApplication kind in the cluster
  KafkaUnavailable = true,     -- the operator could not reach Kafka within its timeout
  ApplyFailed = true,          -- the API server refused an object (e.g. an immutable field)
  AdoptedTopicMismatch = true, -- a topic eopipe did not create lacks what the pipeline needs
  Conflict = true,             -- another, older pipeline writes one of this one's topics
  HangingTransaction = true,   -- an open transaction holds the output's read_committed readers
  LagGrowing = true,           -- the dedup lag stayed above spec.dedup.lagThreshold for its window
  PolicyDenied = true,         -- the spec asks for what the tenant policy refuses (docs/security.md)
  SparkStuck = true,           -- no Spark batch for 10 triggers while the deduped topic holds records
  CheckpointUnreachable = true, -- the Spark checkpoint's store has not answered for 10 s
  DriverNodeLost = true,       -- the Spark driver's node is lost: the admin declares it out of service
}

local function condition(status, type_)
  if status == nil or status.conditions == nil then
    return nil
  end
  for _, c in ipairs(status.conditions) do
    if c.type == type_ then
      return c
    end
  end
  return nil
end

local function describe(c)
  if c == nil then
    return ""
  end
  local text = c.reason or ""
  if c.message ~= nil and c.message ~= "" then
    text = text .. ": " .. c.message
  end
  return text
end

local function rebalancing(status)
  if status.rebalance ~= nil and type(status.rebalance) == "table" and next(status.rebalance) ~= nil then
    return true
  end
  return status.phase == "Rebalancing"
end

local function health(obj)
  local hs = {}
  local status = obj.status
  local generation = (obj.metadata or {}).generation
  local paused = obj.spec ~= nil and obj.spec.paused == true

  if status == nil or status.conditions == nil then
    hs.status = "Progressing"
    hs.message = "Waiting for the operator to report status"
    return hs
  end

  -- Conditions of an older generation say nothing about the current spec (kstatus).
  if generation ~= nil and status.observedGeneration ~= generation then
    hs.status = "Progressing"
    hs.message = "Waiting for the operator to observe generation " .. tostring(generation)
    return hs
  end

  local stalled = condition(status, "Stalled")
  if stalled ~= nil and stalled.status == "True" then
    hs.status = "Degraded"
    hs.message = "Stalled: " .. describe(stalled)
    return hs
  end

  if paused then
    hs.status = "Suspended"
    hs.message = "Paused (spec.paused is true)"
    return hs
  end

  -- Any stage may carry the failure (Ready names only the first stage that is not ready).
  for _, c in ipairs(status.conditions) do
    if c.status == "False" and FAILURE_REASONS[c.reason or ""] then
      hs.status = "Degraded"
      hs.message = c.type .. " " .. describe(c)
      return hs
    end
  end

  local ready = condition(status, "Ready")

  if rebalancing(status) then
    local what = ""
    if type(status.rebalance) == "table" and status.rebalance.phase ~= nil then
      what = " (" .. tostring(status.rebalance.phase) .. ")"
    end
    hs.status = "Progressing"
    hs.message = "Rebalancing" .. what
    return hs
  end

  local reconciling = condition(status, "Reconciling")
  if reconciling ~= nil and reconciling.status == "True" then
    hs.status = "Progressing"
    hs.message = describe(ready)
    return hs
  end

  if ready ~= nil and ready.status == "True" then
    hs.status = "Healthy"
    hs.message = describe(ready)
    return hs
  end

  hs.status = "Progressing"
  if ready ~= nil then
    hs.message = describe(ready)
  else
    hs.message = "Waiting for the Ready condition"
  end
  return hs
end

return health(obj)
