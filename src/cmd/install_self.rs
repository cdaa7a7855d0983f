//! `leasehold __install-self DIR`: copies this binary into DIR, for the init
//! container that gives a wrapped container (`leasehold.dev/run`) the runner.
//! The image is distroless, without a shell or `cp`, so the binary copies itself.

use std::path::{Path, PathBuf};

/// The subcommand's name and the file name in DIR belong to the contract
/// the injection patch that runs this command follows.
pub use crate::api::contract::{INSTALL_SELF_COMMAND as COMMAND, RUNNER_FILE_NAME as FILE_NAME};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// The folder to copy the binary into (a volume shared with the wrapped container).
    #[arg(env = "LEASEHOLD_INSTALL_DIR")]
    pub dir: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("cannot find this executable")]
    Exe(#[source] std::io::Error),
    #[error("copying {from} to {to}")]
    Copy {
        from: PathBuf,
        to: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

/// Copies the running executable to `dir/leasehold`, executable by anyone
/// (the app container's user is not ours), and returns the path. The copy
/// goes to a temporary name first: a restarted init container never leaves
/// a half-written binary under the final name.
pub fn install(dir: &Path) -> Result<PathBuf, Error> {
    let from = std::env::current_exe().map_err(Error::Exe)?;
    let to = dir.join(FILE_NAME);
    let partial = dir.join(format!(".{FILE_NAME}.partial"));
    let copy = || -> std::io::Result<()> {
        std::fs::copy(&from, &partial)?;
        use std::os::unix::fs::PermissionsExt;
        std::fs::set_permissions(&partial, std::fs::Permissions::from_mode(0o755))?;
        std::fs::rename(&partial, &to)
    };
    copy().map_err(|source| Error::Copy {
        from: from.clone(),
        to: to.clone(),
        source,
    })?;
    Ok(to)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt;

    #[test]
    fn the_running_binary_is_copied_executable_by_anyone_and_again_over_itself() {
        let dir = std::env::temp_dir().join(format!("leasehold-install-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for _ in 0..2 {
            let to = install(&dir).unwrap();
            assert_eq!(to, dir.join("leasehold"));
            let exe = std::env::current_exe().unwrap();
            assert_eq!(std::fs::read(&to).unwrap(), std::fs::read(&exe).unwrap());
            assert_eq!(std::fs::metadata(&to).unwrap().permissions().mode() & 0o777, 0o755);
        }
        let names: Vec<_> = std::fs::read_dir(&dir)
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["leasehold"], "no partial copy is left behind");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn a_missing_folder_is_an_error_naming_the_target() {
        let err = install(Path::new("/nonexistent/leasehold-bin")).unwrap_err();
        assert!(
            err.to_string().ends_with("to /nonexistent/leasehold-bin/leasehold"),
            "{err}"
        );
    }
}
