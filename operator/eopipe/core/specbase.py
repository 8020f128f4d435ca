"""The building blocks of the spec models (eopipe.core.spec, eopipe.core.processing): the base
model, omittable sections and the field types the CRD shares."""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field
from pydantic.alias_generators import to_camel

from eopipe.core.durations import DURATION_PATTERN

TOPIC_PATTERN = r"^[a-zA-Z0-9._-]{1,249}$"
QUANTITY_PATTERN = r"^[0-9]+(\.[0-9]+)?(m|k|Ki|Mi|Gi|Ti|M|G|T)?$"

Duration = Annotated[str, Field(pattern=DURATION_PATTERN)]
TopicName = Annotated[str, Field(pattern=TOPIC_PATTERN, max_length=249)]
Quantity = Annotated[str, Field(pattern=QUANTITY_PATTERN)]
# Spark's own memory strings (JVM style), as SparkApplication takes them: "512m", "2g".
SparkMemory = Annotated[str, Field(pattern=r"^[0-9]+[kmgt]?$")]
# A Kubernetes object passed through to the pod as it is (a toleration, an affinity, an
# EnvVarSource): the API server checks it when the operator applies the StatefulSet.
KubeObject = Annotated[dict[str, Any], Field(json_schema_extra={"x-kubernetes-preserve-unknown-fields": True})]


def section(model, **kw):
    """A sub-object that may be omitted: the model's defaults apply, and the CRD says so."""
    return Field(default_factory=model, json_schema_extra={"default": {}}, **kw)


class Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid",
                              frozen=True)


class SecretKeyRef(Model):
    name: str = Field(min_length=1, description="Secret name, in the pipeline's namespace")
    key: str = Field(min_length=1)

    def env(self, name: str) -> dict:
        """The container env var `name` read from this Secret key."""
        return {"name": name, "valueFrom": {"secretKeyRef": {"name": self.name, "key": self.key}}}


class EnvVar(Model):
    name: str = Field(min_length=1, max_length=256, pattern=r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
    value: str | None = None
    value_from: KubeObject | None = Field(
        None, description="a Kubernetes EnvVarSource (secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef)")
