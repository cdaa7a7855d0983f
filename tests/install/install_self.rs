//! The installer init container's command, as the injection patch writes it,
//! leaves a working `leasehold` in the folder (the image is distroless: no
//! shell, no `cp`).

use std::process::Command;

use leasehold::cmd::install_self::{COMMAND, FILE_NAME};

#[test]
fn the_installed_copy_runs() {
    let dir = std::env::temp_dir().join(format!("leasehold-install-self-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let status = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .arg(COMMAND)
        .arg(&dir)
        .status()
        .expect("leasehold runs");
    assert!(status.success());
    let version = Command::new(dir.join(FILE_NAME))
        .arg("--version")
        .output()
        .expect("the copy runs");
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(version.status.success());
    assert_eq!(
        String::from_utf8_lossy(&version.stdout),
        format!("leasehold {}\n", env!("CARGO_PKG_VERSION"))
    );
}

#[test]
fn a_missing_folder_fails_naming_it() {
    let out = Command::new(env!("CARGO_BIN_EXE_leasehold"))
        .args([COMMAND, "/nonexistent/leasehold-bin"])
        .output()
        .expect("leasehold runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent/leasehold-bin/leasehold"), "{stderr}");
}
