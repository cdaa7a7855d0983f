# One image for `leasehold operator` and `leasehold sidecar`.
# Build: docker build -t leasehold:dev .
# tests/install/dockerfile.rs runs this build stage without a daemon: it copies
# exactly the files the COPY lines below name and runs the RUN line's
# command, so a file the build needs and these lines leave out fails the
# test suite.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY src ./src
COPY examples ./examples
# Cargo.toml declares the benchmark target: cargo reads its file even when
# building the binary alone.
COPY benches ./benches
RUN cargo build --release --locked --bin leasehold \
 && strip target/release/leasehold

# glibc + libgcc only; no shell, no package manager; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
# Not at /leasehold: the injected leasehold-install init container mounts an
# emptyDir at /leasehold/bin in this image (src/operator/webhook/patch.rs,
# IMAGE_BINARY and BIN_DIR), which needs /leasehold to be free for a folder.
COPY --from=build /src/target/release/leasehold /usr/local/bin/leasehold
# Numeric, so the kubelet can verify runAsNonRoot (a user name fails with
# "image has non-numeric user ... cannot verify user is non-root").
USER 65532:65532
# Writes nothing outside mounted volumes: runs with readOnlyRootFilesystem.
ENTRYPOINT ["/usr/local/bin/leasehold"]
