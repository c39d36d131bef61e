# syntax=docker/dockerfile:1
# The CoreDNS image with kubeapi and k8s_event, in the style of CoreDNS's
# own: a static binary that may bind port 53 as user 65532 (nonroot). It
# builds for any platform from any host, e.g.
#   docker buildx build --platform linux/amd64,linux/arm64 \
#     --build-arg REVISION=$(git rev-parse --short HEAD) \
#     --build-arg VERSION=$(cat VERSION) --build-arg COREDNS_VERSION=1.15.0 \
#     -t REGISTRY/coredns-k8s-event:TAG .
# (the labels take VERSION and COREDNS_VERSION from the build arguments).
# cmd/coredns is a module of its own; COREDNS_VERSION other than the one
# its go.mod requires builds on that release, as `make image
# COREDNS_VERSION=...` does (hack/coredns.sh), from the plugin's floor up.
# `make image` writes the same image without a builder daemon; the
# settings below match hack/image's (hack/image/dockerfile_test.go checks).
ARG GO_VERSION=1.26
FROM --platform=$BUILDPLATFORM golang:${GO_VERSION}-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libcap2-bin ca-certificates
WORKDIR /src
COPY go.mod go.sum ./
COPY cmd/coredns/go.mod cmd/coredns/go.sum ./cmd/coredns/
RUN cd cmd/coredns && go mod download
COPY . .
ARG TARGETOS TARGETARCH
ARG REVISION=unknown
ARG COREDNS_VERSION=
RUN modfile=$(if [ -n "${COREDNS_VERSION}" ]; then K8S_EVENT_CACHE=/tmp/cache hack/coredns.sh modfile "${COREDNS_VERSION}"; fi) && \
    CGO_ENABLED=0 GOOS=${TARGETOS} GOARCH=${TARGETARCH} go build -C cmd/coredns $modfile -trimpath \
      -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=k8s_event-$(cat VERSION)+${REVISION}" \
      -o /coredns . && \
    setcap cap_net_bind_service=+ep /coredns

FROM gcr.io/distroless/static-debian12:nonroot
ARG REVISION=unknown
ARG COREDNS_VERSION=unknown
ARG VERSION=unknown
COPY --from=build /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/ca-certificates.crt
COPY --from=build /coredns /coredns
LABEL org.opencontainers.image.title="CoreDNS with k8s_event" \
      org.opencontainers.image.description="CoreDNS ${COREDNS_VERSION} with every in-tree plugin, kubeapi and k8s_event ${VERSION}" \
      org.opencontainers.image.version="${COREDNS_VERSION}-${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/dnsops/k8s_event" \
      org.opencontainers.image.url="https://github.com/dnsops/k8s_event" \
      org.opencontainers.image.licenses="Apache-2.0" \
      io.coredns.version="${COREDNS_VERSION}" \
      io.coredns.k8s_event.version="${VERSION}"
USER 65532:65532
WORKDIR /
EXPOSE 53/tcp 53/udp 9153/tcp
ENTRYPOINT ["/coredns"]
