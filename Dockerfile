# coordd in a container: static binaries on distroless, run as non-root
# (uid 65532), data in the volume /var/lib/coordd.
#
#   docker build --build-arg VERSION=$(git describe --tags --always --dirty) -t coordd .
#   docker run -d --name coordd --stop-timeout 30 -v coordd-data:/var/lib/coordd \
#     -p 7420:7420 -p 7421:7421 coordd
#
# The image is a single-node coordd: its embedded etcd's client URL stays on
# loopback (127.0.0.1:7422, never published) and so does its peer URL
# (127.0.0.1:7423). For a cluster member, set COORDD_NAME,
# COORDD_INITIAL_CLUSTER, COORDD_LISTEN_PEER_URLS=http://0.0.0.0:7423 and
# COORDD_INITIAL_ADVERTISE_PEER_URLS=http://<address the other members
# reach>:7423, and publish 7423 to the other members only (plain HTTP, no
# authentication). --stop-timeout 30: docker's default of 10s equals
# coordd's --shutdown-timeout, so a slow graceful stop would be killed.

# The go line of go.mod; --build-arg GO_VERSION=1.26 takes the newest 1.26.x.
ARG GO_VERSION=1.26.0

FROM golang:${GO_VERSION} AS build
WORKDIR /src
# The modules' go.mod and go.sum first (the root's replaces the SDK's
# modules with these directories), so the download is cached apart. The
# root module's build list holds every other module's requirements.
COPY go.mod go.sum ./
COPY clientlib/go.mod clientlib/go.sum ./clientlib/
COPY proto/go.mod proto/go.sum ./proto/
COPY fencing/go.mod fencing/go.sum ./fencing/
COPY internal/shared/go.mod ./internal/shared/
RUN GOWORK=off go mod download
COPY . .
# Both binaries stamp VERSION (coordd --version, coordctl --version).
ARG VERSION=dev
ENV CGO_ENABLED=0
RUN go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/coordd ./cmd/coordd \
 && go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/coordctl ./cmd/coordctl \
 && mkdir /out/data

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/coordd /out/coordctl /usr/local/bin/
# An empty directory owned by nonroot: a new named volume starts as a copy
# of it. A bind mount must be writable by uid 65532 itself.
COPY --from=build --chown=65532:65532 /out/data /var/lib/coordd
VOLUME /var/lib/coordd
ENV COORDD_DATA_DIR=/var/lib/coordd \
    COORDD_GRPC_ADDR=0.0.0.0:7420 \
    COORDD_HTTP_ADDR=0.0.0.0:7421
# gRPC, HTTP (REST, /healthz, /readyz, /metrics), etcd peers (clusters only).
EXPOSE 7420 7421 7423
USER 65532:65532
STOPSIGNAL SIGTERM
ENTRYPOINT ["/usr/local/bin/coordd"]
