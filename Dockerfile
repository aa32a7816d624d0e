# syntax=docker/dockerfile:1

# Pulse sidecar image.
#
#   docker build -t pulse --build-arg VERSION=$(git describe --tags --always) .
#   docker build -t pulse-receiver --target receiver .     # the demo webhook receiver
#
# The final image is distroless: a static binary, CA certificates, no shell, user 65532 (nonroot). The container
# healthcheck therefore runs the binary itself (`pulse healthcheck`).

ARG GO_VERSION=1.26

# ---- shared build base: module cache warmed from go.mod/go.sum, then the sources ----
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS base
WORKDIR /src
# GOWORK=off: the image needs the sidecar's module only; go.work also lists charts/ (the chart tests' own
# module), which .dockerignore leaves out.
ENV CGO_ENABLED=0 GOFLAGS=-buildvcs=false GOWORK=off
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .

# ---- the sidecar binary ----
FROM base AS build
ARG VERSION=dev
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/go/pkg/mod \
    --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/pulse . \
 && mkdir -p /out/data

# ---- the demo receiver (examples/receiver, standard library only) ----
FROM base AS receiver-build
ARG TARGETOS
ARG TARGETARCH
RUN --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} \
    go build -trimpath -ldflags "-s -w" -o /out/receiver ./examples/receiver

FROM gcr.io/distroless/static-debian12:nonroot AS receiver
COPY --from=receiver-build /out/receiver /receiver
USER 65532:65532
ENV RECEIVER_LISTEN=:3000
EXPOSE 3000
HEALTHCHECK --interval=10s --timeout=3s --retries=3 CMD ["/receiver", "-healthcheck"]
ENTRYPOINT ["/receiver"]

# ---- the sidecar image (default target: keep this stage last) ----
FROM gcr.io/distroless/static-debian12:nonroot AS pulse
ARG VERSION=dev
LABEL org.opencontainers.image.title="pulse" \
      org.opencontainers.image.description="Pulse sidecar: durable events in MongoDB, delivered to webhooks" \
      org.opencontainers.image.source="https://github.com/pulse-sidecar/pulse" \
      org.opencontainers.image.version="${VERSION}"
COPY --from=build /out/pulse /pulse
# Writable directory for the embedded development database (used only when PULSE_MONGODB_URI is empty).
COPY --from=build --chown=65532:65532 /out/data /data
# The binary's API listens on 127.0.0.1:8080 by default; a container on its own must listen on all interfaces,
# and the sidecar then refuses to start without PULSE_API_TOKEN. The probes and /metrics have their own port,
# without a token. (The Helm chart sets both itself and keeps the API on the pod's loopback.)
ENV PULSE_LISTEN=0.0.0.0:8080 \
    PULSE_PROBE_LISTEN=0.0.0.0:8081 \
    PULSE_DATA_DIR=/data
USER 65532:65532
EXPOSE 8080 8081
HEALTHCHECK --interval=10s --timeout=5s --start-period=20s --retries=3 CMD ["/pulse", "healthcheck"]
ENTRYPOINT ["/pulse"]
CMD ["serve"]
