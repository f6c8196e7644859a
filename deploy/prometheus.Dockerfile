# Prometheus from Debian's package, for clusters that cannot pull prom/prometheus. It takes the
# same config path, storage path and port as that image, so the Compose file works with either.
#   docker build -f deploy/prometheus.Dockerfile -t localpar-prometheus .
ARG DEBIAN=debian:12
FROM ${DEBIAN}
ENV DEBIAN_FRONTEND=noninteractive
# hadolint ignore=DL3008
RUN apt-get update \
 && apt-get install -y --no-install-recommends prometheus ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && mkdir -p /prometheus && chown prometheus /prometheus
COPY deploy/compose/prometheus.yml /etc/prometheus/prometheus.yml
USER prometheus
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus", "--config.file=/etc/prometheus/prometheus.yml", \
            "--storage.tsdb.path=/prometheus", "--web.listen-address=0.0.0.0:9090"]
