# The CoreDNS image with kubeapi and k8s_event, in the style of CoreDNS's
# own: a static binary that may bind port 53 as user nonroot (65532).
# `make image` writes the same image without a builder daemon.
ARG GO_VERSION=1.26
FROM golang:${GO_VERSION}-bookworm AS build
RUN apt-get update && apt-get install -y --no-install-recommends libcap2-bin ca-certificates
WORKDIR /src
COPY go.mod go.sum ./
RUN go mod download
COPY . .
ARG REVISION=unknown
RUN CGO_ENABLED=0 go build -trimpath \
      -ldflags "-s -w -X github.com/coredns/coredns/coremain.GitCommit=k8s_event-$(cat VERSION)+${REVISION}" \
      -o /coredns ./cmd/coredns && \
    setcap cap_net_bind_service=+ep /coredns

FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /etc/ssl/certs /etc/ssl/certs
COPY --from=build /coredns /coredns
USER nonroot:nonroot
EXPOSE 53 53/udp 9153
ENTRYPOINT ["/coredns"]
