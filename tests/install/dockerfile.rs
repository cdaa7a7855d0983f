//! The container image builds from the Dockerfile, checked without a
//! container daemon (tests/support/dockerfile.rs runs the build stage as
//! written), and the binary lands where the injected containers need it.

#[path = "../support/dockerfile.rs"]
mod image_build;

use std::path::Path;
use std::process::Command;

use image_build::{Stage, exec_form, image_and_build_stage, parse, parse_copy, prepare_context, root, run_build};
use leasehold::api::contract::{BIN_DIR, IMAGE_BINARY};

fn stages() -> Vec<Stage> {
    parse(&std::fs::read_to_string(root().join("Dockerfile")).unwrap()).unwrap()
}

/// The RUN line's release build (unoptimised: `image_build::QUICK_RELEASE`),
/// in the persistent build folder, then the binary the final stage copies:
/// it runs, and it is where the image's ENTRYPOINT and the code say.
#[test]
fn the_image_builds_from_the_dockerfile() {
    let (binary, destination) = image_build::build_image_binary().unwrap_or_else(|e| panic!("{e}"));
    let version = Command::new(&binary).arg("--version").output().unwrap();
    assert!(version.status.success(), "{} --version: {version:?}", binary.display());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout).trim(),
        format!("leasehold {}", env!("CARGO_PKG_VERSION"))
    );
    assert_eq!(
        destination, IMAGE_BINARY,
        "the Dockerfile copies the binary elsewhere than IMAGE_BINARY"
    );
    let stages = stages();
    let entrypoint = stages.last().unwrap().all("ENTRYPOINT").last().map(exec_form);
    assert_eq!(entrypoint, Some(Ok(vec![IMAGE_BINARY.to_string()])));
}

/// The `sidecar` image (the candidate build, Cargo feature `candidate`) is
/// checked without building it (the full build above takes minutes of its
/// own): its build stage copies what the full one copies, its RUN line runs
/// the full one's cargo command with the features and the static link
/// scripts/candidate-binary.sh builds with (so tests/processes/candidate.rs
/// tests what the image holds) and puts the binary where the full build
/// does, and the image copies it where the full image does, with the same
/// user and entrypoint, on the same distroless base without libc.
#[test]
fn the_sidecar_image_is_the_full_build_with_the_candidate_feature_linked_statically() {
    const FEATURES: &str = "--no-default-features --features candidate";
    const STATIC: &str = "RUSTFLAGS=\"-C target-feature=+crt-static\"";
    let stages = stages();
    let (full, full_build, full_copy) = image_and_build_stage(&stages, None).unwrap();
    let (sidecar, sidecar_build, sidecar_copy) = image_and_build_stage(&stages, Some("sidecar")).unwrap();
    let all = |stage: &Stage, keyword| stage.all(keyword).map(str::to_string).collect::<Vec<_>>();
    assert_eq!(all(&sidecar_build, "COPY"), all(&full_build, "COPY"));
    assert_eq!(all(&sidecar_build, "WORKDIR"), all(&full_build, "WORKDIR"));
    assert_eq!(sidecar_build.from, full_build.from);
    let [full_run] = all(&full_build, "RUN").try_into().unwrap();
    let [sidecar_run] = all(&sidecar_build, "RUN").try_into().unwrap();
    let full_cargo = full_run.split(" && ").next().unwrap();
    let flags = full_cargo
        .strip_prefix("cargo build ")
        .expect("the full RUN line starts with `cargo build`");
    let expected = format!("{STATIC} cargo build --target \"$host\" {FEATURES} {flags}");
    assert!(
        sidecar_run.split(" && ").any(|command| command == expected),
        "the sidecar stage's RUN line runs no `{expected}`: {sidecar_run}"
    );
    assert!(
        sidecar_run.contains("strip -o target/release/leasehold \"target/$host/release/leasehold\""),
        "the sidecar stage leaves its binary elsewhere than the full build: {sidecar_run}"
    );
    let script = std::fs::read_to_string(root().join("scripts/candidate-binary.sh")).unwrap();
    for flag in [FEATURES, STATIC, "--target \"$host\""] {
        assert!(
            script.contains(flag),
            "scripts/candidate-binary.sh builds without {flag}"
        );
    }
    assert_eq!(
        (sidecar_copy.sources, sidecar_copy.destination),
        (full_copy.sources, full_copy.destination)
    );
    for keyword in ["USER", "ENTRYPOINT"] {
        assert_eq!(all(sidecar, keyword), all(full, keyword), "{keyword}");
    }
    assert_eq!(sidecar.from, full.from.replacen("/cc-", "/static-", 1));
}

/// Every COPY line of the build stage is needed: without any one of them the
/// RUN line fails (in a scratch folder: each fails while cargo reads the
/// manifest, before anything compiles). This is the check above catching a
/// Dockerfile that leaves a needed file out, as it did with `benches/`.
#[test]
fn leaving_out_any_copied_file_fails_the_build() {
    let stages = stages();
    let (_, build, _) = image_and_build_stage(&stages, None).unwrap();
    let copies: Vec<usize> = (build.instructions.iter().enumerate())
        .filter(|(_, i)| i.keyword == "COPY")
        .map(|(n, _)| n)
        .collect();
    assert!(copies.len() >= 4, "Cargo.toml and Cargo.lock, src, examples, benches");
    for left_out in copies {
        let mut mutant = build.clone();
        let removed = mutant.instructions.remove(left_out);
        let scratch = tempdir(&format!("mutant-{left_out}"));
        prepare_context(&mutant, &scratch).unwrap();
        // Offline: a mutant without Cargo.lock must fail on --locked, not
        // wait for the network.
        let offline = Stage {
            instructions: (mutant.instructions.iter().cloned())
                .map(|mut i| {
                    if i.keyword == "RUN" {
                        i.arguments = i.arguments.replacen("cargo build", "cargo build --offline", 1);
                    }
                    i
                })
                .collect(),
            ..mutant
        };
        let outcome = run_build(&offline, &scratch);
        std::fs::remove_dir_all(&scratch).unwrap();
        let Err(failure) = outcome else {
            panic!(
                "the build stage without `COPY {}` still builds: that line is not needed",
                removed.arguments
            );
        };
        // For the want of what that line copies, not for another reason.
        let copy = parse_copy(&removed.arguments).unwrap();
        assert!(
            (copy.sources.iter()).any(|s| failure.contains(s.trim_start_matches("./").trim_end_matches('/'))),
            "without `COPY {}` the build fails for another reason:\n{failure}",
            removed.arguments
        );
    }
}

fn tempdir(name: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!("leasehold-dockerfile-{}-{name}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// Why a volume mounted at `mount` in leasehold's image breaks the image,
/// if it does: runc cannot make a folder where the image has the binary
/// ("not a directory"), and a mount over the binary's folder hides it.
fn mount_problem(binary: &str, mount: &str) -> Option<String> {
    let mount = Path::new(mount);
    if mount.ancestors().any(|folder| folder == Path::new(binary)) {
        return Some(format!(
            "{} needs a folder where the image has the file {binary}",
            mount.display()
        ));
    }
    Path::new(binary)
        .starts_with(mount)
        .then(|| format!("{} hides {binary}", mount.display()))
}

#[test]
fn the_installer_mount_leaves_the_image_binary_alone() {
    assert_eq!(mount_problem(IMAGE_BINARY, BIN_DIR), None);
    // The image as it was: the binary at /leasehold, the mount at /leasehold/bin.
    assert!(mount_problem("/leasehold", "/leasehold/bin").is_some());
    assert!(mount_problem("/leasehold/bin/leasehold", "/leasehold/bin").is_some());
}

#[test]
fn the_parser_reads_continuations_stages_and_copies() {
    let stages =
        parse("# c\nFROM a AS build\nWORKDIR /src\nRUN x \\\n && y\n\nFROM b\nCOPY --from=build /src/t /t\n").unwrap();
    assert_eq!(stages.len(), 2);
    assert_eq!(stages[0].name.as_deref(), Some("build"));
    assert_eq!(stages[0].all("RUN").collect::<Vec<_>>(), ["x && y"]);
    let copy = parse_copy(stages[1].all("COPY").next().unwrap()).unwrap();
    assert_eq!(
        (copy.from.as_deref(), copy.sources, copy.destination.as_str()),
        (Some("build"), vec!["/src/t".to_string()], "/t")
    );
    assert!(
        parse_copy("--chown=1 a b").is_err(),
        "an unsupported flag is refused, not ignored"
    );
    assert!(parse("RUN x\n").is_err());
}
