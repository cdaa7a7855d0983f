# One image for `leasehold operator` and `leasehold sidecar`.
# Build: docker build -t leasehold:dev .
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY examples ./examples
RUN cargo build --release --locked --bin leasehold \
 && strip target/release/leasehold

# glibc + libgcc only; no shell, no package manager; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=build /src/target/release/leasehold /leasehold
# Numeric, so the kubelet can verify runAsNonRoot (a user name fails with
# "image has non-numeric user ... cannot verify user is non-root").
USER 65532:65532
# Writes nothing outside mounted volumes: runs with readOnlyRootFilesystem.
ENTRYPOINT ["/leasehold"]
