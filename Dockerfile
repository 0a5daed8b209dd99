# syntax=docker/dockerfile:1
#
# kvroute's image: a static binary on distroless, run as a non-root user.
#
#   docker build --build-arg VERSION=$(git describe --tags --always) -t kvroute .
#   docker run -p 8080:8080 -p 9464:9464 kvroute serve --listen 0.0.0.0:8080 \
#     --metrics-listen 0.0.0.0:9464 --backend gpu0=http://10.0.0.5:8000
#
# The build line below is the one cmd/kvroute's TestDockerBuildCommand runs
# outside Docker, so that it is known to build even where no Docker is.

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
ARG TARGETOS=linux
ARG TARGETARCH=amd64
# Empty: `kvroute --version` says "devel" (.git is not in the build context).
ARG VERSION=
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    CGO_ENABLED=0 GOOS=$TARGETOS GOARCH=$TARGETARCH \
    go build -trimpath -ldflags "-s -w -X main.version=${VERSION}" -o /out/kvroute ./cmd/kvroute

# static-debian12 has CA certificates (https backends), /etc/passwd with the
# nonroot user 65532 and tzdata, and nothing else: no shell, no libc. The
# binary needs none (CGO_ENABLED=0: Go's own resolver and TLS).
FROM gcr.io/distroless/static-debian12:nonroot
COPY --from=build /out/kvroute /kvroute
USER 65532:65532
# 8080: the OpenAI API; 9464: /metrics and /healthz (--metrics-listen).
EXPOSE 8080 9464
ENTRYPOINT ["/kvroute"]
# In a container the listeners must not be on loopback (the defaults are);
# backends come from --backend, --config or KVROUTE_BACKEND.
CMD ["serve", "--listen", "0.0.0.0:8080", "--metrics-listen", "0.0.0.0:9464"]
