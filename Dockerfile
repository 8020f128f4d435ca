# syntax=docker/dockerfile:1
# eopipe images (docs/design.md#architecture):
#   docker build --target operator -t eopipe:0.1.0 .        operator and dedup worker (default)
#   docker build --target spark    -t eopipe-spark:0.1.0 .  Spark + pyspark + spark_app + Kafka and s3a jars
# Every build step fetches from package registries only: pip (PyPI), apt (Debian), Maven
# (Maven Central, through hack/fetch-spark-jars.sh and hack/spark/pom.xml). No curl, no wget.
# tests/unit/test_dockerfile.py checks this file statically (no Docker engine runs in CI here).

ARG PYTHON_IMAGE=python:3.12-slim-bookworm

# --- shared base: Python, no bytecode writes at run time, no pip cache -------------------
FROM ${PYTHON_IMAGE} AS python-base
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN groupadd --gid 10001 eopipe \
 && useradd --uid 10001 --gid 10001 --home-dir /var/lib/eopipe --no-create-home \
            --shell /usr/sbin/nologin eopipe \
 && mkdir -p /var/lib/eopipe \
 && chown 10001:10001 /var/lib/eopipe

# --- builder: wheels of the project and of all its dependencies --------------------------
FROM python-base AS builder
# A CA bundle for pip behind a TLS-inspecting proxy (a build argument: never in the image).
ARG PIP_CERT
# A C compiler for the project's compiled hot path (Cython, a build requirement from PyPI);
# Python's headers come with the python image. Only this stage has them.
RUN apt-get update \
 && apt-get install -y --no-install-recommends gcc libc6-dev \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml README.md ./
COPY operator/ operator/
COPY spark_app/ spark_app/
RUN pip wheel --wheel-dir /wheels .

# --- Spark base: Java 17 (Debian), pyspark (PyPI) -----------------------------------------
FROM python-base AS spark-base
ARG PIP_CERT
RUN apt-get update \
 && apt-get install -y --no-install-recommends openjdk-17-jre-headless procps tini \
 && rm -rf /var/lib/apt/lists/* \
 && ln -s "$(dirname "$(dirname "$(readlink -f "$(command -v java)")")")" /usr/lib/jvm/java-17
# pyspark as pinned in pyproject.toml's `spark` extra, the one place the Spark release is written.
COPY pyproject.toml hack/spark-version.sh /tmp/eopipe-spark/
RUN pip install "pyspark==$(sh /tmp/eopipe-spark/spark-version.sh /tmp/eopipe-spark/pyproject.toml)" \
                "confluent-kafka>=2.6,<3" \
 && rm -rf /tmp/eopipe-spark \
 && ln -s "$(python -c 'import os, pyspark; print(os.path.dirname(pyspark.__file__))')" /opt/spark
ENV JAVA_HOME=/usr/lib/jvm/java-17 \
    SPARK_HOME=/opt/spark \
    PYSPARK_PYTHON=python3
ENV PATH="${SPARK_HOME}/bin:${PATH}"

# --- Spark connector jars, resolved by Maven from hack/spark/pom.xml ----------------------
FROM spark-base AS spark-jars
# e.g. -Djavax.net.ssl.trustStore=... for Maven behind a TLS-inspecting proxy (build time only).
ARG MAVEN_OPTS
RUN apt-get update \
 && apt-get install -y --no-install-recommends maven \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml ./
COPY hack/lib.sh hack/fetch-spark-jars.sh hack/fetch-hadoop-aws.sh hack/spark-version.sh hack/
COPY hack/spark/pom.xml hack/spark/hadoop-aws-pom.xml hack/spark/
# Same scripts as the tests use, each leaving out the jars pyspark already ships:
# spark-sql-kafka and its runtime dependencies (/cache/spark-kafka-<version>/jars), and
# hadoop-aws of pyspark's Hadoop client with the AWS SDK's S3 client, for s3a:// checkpoints
# and file sinks (/cache/hadoop-aws-<version>/jars).
RUN EOPIPE_CACHE=/cache bash hack/fetch-spark-jars.sh "${SPARK_HOME}/jars" \
 && EOPIPE_CACHE=/cache bash hack/fetch-hadoop-aws.sh "${SPARK_HOME}/jars" \
 && mkdir -p /out \
 && cp /cache/spark-kafka-*/jars/*.jar /cache/hadoop-aws-*/jars/*.jar /out/

# --- target: spark ------------------------------------------------------------------------
FROM spark-base AS spark
COPY --from=spark-jars /out/ ${SPARK_HOME}/jars/
COPY spark_app/ /opt/eopipe/spark_app/
COPY hack/spark/entrypoint.sh /opt/eopipe/entrypoint.sh
# Class data sharing (docs/design.md#spark-start): the archive of the classes a training run
# loads, which drivers and executors then map instead of loading them (a third less CPU to
# start). After the jars: the archive holds only for the jars it was made with.
COPY hack/spark/cds-train.py /tmp/cds-train.py
RUN cd /tmp && { /opt/eopipe/entrypoint.sh cds-dump /tmp/cds-train.py > /tmp/cds.log 2>&1 \
      || { tail -n 50 /tmp/cds.log; exit 1; }; } \
 && rm -rf /tmp/* /tmp/.[!.]*
# Spark runs in its working directory and writes there (an executor fetches the driver's
# files, spark_app.zip, into it): one the runtime user owns, as Spark's own work-dir.
RUN mkdir -p /opt/eopipe/work && chown 10001:10001 /opt/eopipe/work
ENV PYTHONPATH=/opt/eopipe
WORKDIR /opt/eopipe/work
USER 10001:10001
ENTRYPOINT ["/usr/bin/tini", "--", "/opt/eopipe/entrypoint.sh"]

# --- target: operator (the default): `eopipe operator` or `eopipe dedup ...` --------------
FROM python-base AS operator
COPY --from=builder /wheels /wheels
RUN pip install --no-index --find-links /wheels eopipe \
 && rm -rf /wheels
# RocksDB state of the dedup worker (a PersistentVolume in the StatefulSet).
WORKDIR /var/lib/eopipe
USER 10001:10001
EXPOSE 8081 9090
ENTRYPOINT ["eopipe"]
CMD ["operator"]
