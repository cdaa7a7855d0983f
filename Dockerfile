# One Dockerfile, two images:
#   docker build -t leasehold:dev .
#     every command: the operator's image, which also serves as the sidecar's
#   docker build --target sidecar -t leasehold-sidecar:dev .
#     the candidate build (Cargo feature `candidate`): a pod's commands only
#     (sidecar, run, the runner's installer, version)
# The chart injects the full image unless sidecar.image names the second
# (charts/leasehold/values.yaml; BENCHMARKS.md, footprint, for the sizes).
# tests/install/dockerfile.rs runs the full build stage without a daemon: it
# copies exactly the files the COPY lines name and runs the RUN line's
# command, so a file the build needs and these lines leave out fails the
# test suite. The sidecar build stage shares those COPY lines (FROM source)
# and its RUN line is the full one's cargo command with the feature flags,
# statically linked (checked there).
FROM rust:1-bookworm AS source
WORKDIR /src
COPY Cargo.toml Cargo.lock ./
COPY crates ./crates
COPY src ./src
# Cargo.toml declares the benchmark target: cargo reads its file even when
# building the binary alone.
COPY benches ./benches

# Linked statically (scripts/candidate-binary.sh builds the suite's the same
# way): the image needs no libc, and an idle sidecar maps no shared library
# (BENCHMARKS.md, the candidate build). glibc resolves names from files and
# DNS without loading a module since 2.34; `--target` keeps the flag off
# build scripts and proc-macros.
FROM source AS build-sidecar
RUN host="$(rustc -vV | sed -n 's/^host: //p')" \
 && RUSTFLAGS="-C target-feature=+crt-static" cargo build --target "$host" --no-default-features --features candidate --release --locked --bin leasehold \
 && mkdir -p target/release && strip -o target/release/leasehold "target/$host/release/leasehold"

FROM source AS build
RUN cargo build --release --locked --bin leasehold \
 && strip target/release/leasehold

# The candidate image: the same path, user and entrypoint as the full image
# below (the injected containers and the installer rely on them), on the
# same distroless base without glibc and libgcc, which it does not load.
FROM gcr.io/distroless/static-debian12:nonroot AS sidecar
COPY --from=build-sidecar /src/target/release/leasehold /usr/local/bin/leasehold
USER 65532:65532
ENTRYPOINT ["/usr/local/bin/leasehold"]

# The full image, last so that a plain `docker build .` gives it.
# glibc + libgcc only; no shell, no package manager; runs as uid 65532.
FROM gcr.io/distroless/cc-debian12:nonroot
# Not at /leasehold: the injected leasehold-install init container mounts an
# emptyDir at /leasehold/bin in this image (crates/leasehold-operator/src/webhook/patch.rs,
# IMAGE_BINARY and BIN_DIR), which needs /leasehold to be free for a folder.
COPY --from=build /src/target/release/leasehold /usr/local/bin/leasehold
# Numeric, so the kubelet can verify runAsNonRoot (a user name fails with
# "image has non-numeric user ... cannot verify user is non-root").
USER 65532:65532
# Writes nothing outside mounted volumes: runs with readOnlyRootFilesystem.
ENTRYPOINT ["/usr/local/bin/leasehold"]
