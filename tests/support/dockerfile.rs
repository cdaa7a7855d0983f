//! The Dockerfile's build stage, run without a container daemon: exactly the
//! files its `COPY` lines name (less what `.dockerignore` excludes) are copied
//! into a build folder, and its `RUN` line runs there with `sh -c`, as
//! `docker build` would run it in the `rust` image. A file the build needs
//! that the `COPY` lines leave out therefore fails here as it fails there.
//!
//! The build folder is `<target dir>/dockerfile/src` (the stage's WORKDIR) and
//! outlives the run: its `target/` stays, and a file is rewritten only when
//! its bytes changed, so cargo rebuilds only what changed.
//!
//! The `RUN` line runs as written, with the release profile's optimisation
//! turned down through cargo's environment ([`QUICK_RELEASE`]): what the
//! Dockerfile decides (its files, its command, where the binary lands) is
//! checked, while how hard the compiler optimises is Cargo.toml's and not the
//! Dockerfile's. As written, every change under `src/` cost this test about
//! 7 minutes of both cores (fat LTO, one codegen unit: 420 s in CI, beside
//! the timed end-to-end scenarios); at opt-level 0 it is an ordinary build.

#![allow(dead_code)] // the end-to-end suite uses the binary, the Dockerfile test the parsing too

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

/// One instruction: its keyword (upper case) and the rest of its line, with
/// continuation lines joined.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Instruction {
    pub keyword: String,
    pub arguments: String,
}

/// A `FROM` and the instructions up to the next one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stage {
    pub from: String,
    pub name: Option<String>,
    pub instructions: Vec<Instruction>,
}

impl Stage {
    pub fn all(&self, keyword: &'static str) -> impl Iterator<Item = &str> {
        self.instructions
            .iter()
            .filter(move |i| i.keyword == keyword)
            .map(|i| i.arguments.as_str())
    }

    fn last(&self, keyword: &'static str) -> Option<&str> {
        self.all(keyword).last()
    }
}

/// A `COPY` line: its `--from` stage (if any), sources and destination.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Copy {
    pub from: Option<String>,
    pub sources: Vec<String>,
    pub destination: String,
}

/// The stages of a Dockerfile, in order. Comments and blank lines are
/// dropped, a trailing backslash joins the next line.
pub fn parse(dockerfile: &str) -> Result<Vec<Stage>, String> {
    let mut stages: Vec<Stage> = Vec::new();
    let mut pending = String::new();
    for line in dockerfile.lines() {
        let trimmed = line.trim();
        if trimmed.starts_with('#') || (trimmed.is_empty() && pending.is_empty()) {
            continue;
        }
        match trimmed.strip_suffix('\\') {
            Some(part) => {
                pending.push_str(part);
                pending.push(' ');
                continue;
            }
            None => pending.push_str(trimmed),
        }
        let line = std::mem::take(&mut pending);
        let (keyword, arguments) = line.split_once(char::is_whitespace).unwrap_or((&line, ""));
        let instruction = Instruction {
            keyword: keyword.to_uppercase(),
            arguments: arguments.split_whitespace().collect::<Vec<_>>().join(" "),
        };
        if instruction.keyword == "FROM" {
            let words: Vec<&str> = instruction.arguments.split(' ').collect();
            let (from, name) = match words.as_slice() {
                [image] => (image.to_string(), None),
                [image, as_, name] if as_.eq_ignore_ascii_case("as") => (image.to_string(), Some(name.to_string())),
                _ => return Err(format!("cannot read `FROM {}`", instruction.arguments)),
            };
            stages.push(Stage {
                from,
                name,
                instructions: Vec::new(),
            });
        } else {
            stages
                .last_mut()
                .ok_or_else(|| format!("`{}` before the first FROM", instruction.keyword))?
                .instructions
                .push(instruction);
        }
    }
    Ok(stages)
}

/// A `COPY` line's arguments; any flag but `--from` is refused (this runner
/// does not implement it).
pub fn parse_copy(arguments: &str) -> Result<Copy, String> {
    let mut from = None;
    let mut words = Vec::new();
    for word in arguments.split(' ') {
        match word.strip_prefix("--from=") {
            Some(stage) => from = Some(stage.to_string()),
            None if word.starts_with("--") => return Err(format!("COPY flag {word} is not supported here")),
            None => words.push(word.to_string()),
        }
    }
    let destination = words.pop().filter(|_| !words.is_empty());
    let destination = destination.ok_or_else(|| format!("COPY {arguments}: needs a source and a destination"))?;
    Ok(Copy {
        from,
        sources: words,
        destination,
    })
}

/// An exec-form `ENTRYPOINT`/`CMD` (`["a", "b"]`) as its words.
pub fn exec_form(arguments: &str) -> Result<Vec<String>, String> {
    serde_json::from_str(arguments).map_err(|e| format!("not an exec-form list: {arguments}: {e}"))
}

/// The repository root.
pub fn root() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

/// An image's final stage (`target`, a stage's name; the last stage when
/// None, as `docker build` without `--target`) and the build stage it copies
/// the binary from, with the instructions of the stages that one is built
/// `FROM` first, as Docker runs them; the `COPY --from` line too.
pub fn image_and_build_stage<'a>(
    stages: &'a [Stage],
    target: Option<&str>,
) -> Result<(&'a Stage, Stage, Copy), String> {
    let image = match target {
        None => stages.last().ok_or("the Dockerfile has no FROM")?,
        Some(name) => named(stages, name)?,
    };
    let copy = image
        .all("COPY")
        .map(parse_copy)
        .collect::<Result<Vec<_>, _>>()?
        .into_iter()
        .find(|c| c.from.is_some())
        .ok_or("the final stage copies nothing from a build stage")?;
    let build = with_parents(stages, named(stages, copy.from.as_deref().unwrap_or_default())?)?;
    Ok((image, build, copy))
}

fn named<'a>(stages: &'a [Stage], name: &str) -> Result<&'a Stage, String> {
    stages
        .iter()
        .find(|s| s.name.as_deref() == Some(name))
        .ok_or_else(|| format!("no stage named {name}"))
}

/// `stage` with the instructions of the stage it is built `FROM` (if it
/// names one, recursively) before its own, and that stage's base image.
/// Docker takes a stage name in `FROM` only from the stages above it.
fn with_parents(stages: &[Stage], stage: &Stage) -> Result<Stage, String> {
    let above = stages
        .iter()
        .position(|s| std::ptr::eq(s, stage))
        .ok_or("a stage of another Dockerfile")?;
    let Some(parent) = stages[..above]
        .iter()
        .find(|s| s.name.as_deref() == Some(stage.from.as_str()))
    else {
        return Ok(stage.clone());
    };
    let mut resolved = with_parents(stages, parent)?;
    resolved.name = stage.name.clone();
    resolved.instructions.extend(stage.instructions.iter().cloned());
    Ok(resolved)
}

/// `.dockerignore`'s patterns. Only plain paths (a folder or a file, with or
/// without a trailing slash) are understood; anything else is refused, so a
/// pattern this runner would misread fails loudly.
fn ignored_paths(root: &Path) -> Result<Vec<String>, String> {
    let Ok(text) = fs::read_to_string(root.join(".dockerignore")) else {
        return Ok(Vec::new());
    };
    text.lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|pattern| {
            if pattern.contains(['*', '?', '[', '!']) {
                Err(format!(".dockerignore pattern {pattern} is not supported here"))
            } else {
                Ok(pattern.trim_matches('/').to_string())
            }
        })
        .collect()
}

/// Adds to `files` every file `from` holds (itself, or a folder's files
/// recursively) as its path under `to`, skipping what `.dockerignore`
/// excludes (`relative` is `from` in the build context).
fn collect(
    from: &Path,
    to: &Path,
    relative: &str,
    ignored: &[String],
    files: &mut BTreeMap<PathBuf, PathBuf>,
) -> Result<(), String> {
    if ignored
        .iter()
        .any(|i| relative == i || relative.starts_with(&format!("{i}/")))
    {
        return Ok(());
    }
    if from.is_dir() {
        let entries = fs::read_dir(from).map_err(|e| format!("{}: {e}", from.display()))?;
        for entry in entries {
            let name = entry.map_err(|e| e.to_string())?.file_name();
            let name = name.to_string_lossy();
            collect(
                &from.join(&*name),
                &to.join(&*name),
                &format!("{relative}/{name}"),
                ignored,
                files,
            )?;
        }
    } else {
        files.insert(to.to_path_buf(), from.to_path_buf());
    }
    Ok(())
}

/// Makes `dir` hold exactly `files` (path in `dir` -> source), `target/`
/// aside. A file whose bytes are already there is left alone, so cargo sees
/// it unchanged; any other is written anew, so cargo sees it changed (by
/// content, not by the source's modification time, which can predate the
/// last build when a file was edited during it).
fn sync(dir: &Path, files: &BTreeMap<PathBuf, PathBuf>) -> Result<(), String> {
    fn what(path: &Path) -> impl Fn(std::io::Error) -> String + '_ {
        move |e| format!("{}: {e}", path.display())
    }
    let mut folders = vec![dir.to_path_buf()];
    while let Some(folder) = folders.pop() {
        for entry in fs::read_dir(&folder).map_err(what(&folder))? {
            let path = entry.map_err(what(&folder))?.path();
            if path == dir.join("target") {
                continue;
            }
            if path.is_dir() {
                folders.push(path);
            } else if !files.contains_key(&path) {
                fs::remove_file(&path).map_err(what(&path))?;
            }
        }
    }
    for (to, from) in files {
        let bytes = fs::read(from).map_err(what(from))?;
        if fs::read(to).ok().as_ref() != Some(&bytes) {
            fs::create_dir_all(to.parent().unwrap_or(dir)).map_err(what(to))?;
            fs::write(to, &bytes).map_err(what(to))?;
        }
    }
    Ok(())
}

/// The build folder: `<target dir>/dockerfile/src`, next to the suite's own
/// build (the target dir holds the test binary that runs this).
pub fn build_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("the test binary's path");
    // <target>/debug/deps/<test binary>
    let target = exe.ancestors().nth(3).expect("the target dir");
    target.join("dockerfile").join("src")
}

/// Fills `dir` (the stage's WORKDIR) with exactly what the build stage's
/// `COPY` lines name, leaving its `target/` (cargo's output) in place.
pub fn prepare_context(build: &Stage, dir: &Path) -> Result<(), String> {
    let root = root();
    let ignored = ignored_paths(root)?;
    let workdir = build.last("WORKDIR").ok_or("the build stage sets no WORKDIR")?;
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let mut files = BTreeMap::new();
    for arguments in build.all("COPY") {
        let copy = parse_copy(arguments)?;
        if copy.from.is_some() {
            return Err(format!(
                "COPY {arguments}: copies between build stages are not supported here"
            ));
        }
        // Relative to WORKDIR, which the build folder stands for.
        let destination = copy.destination.trim_start_matches(workdir).trim_start_matches("./");
        let into_folder = copy.destination.ends_with('/') || copy.sources.len() > 1;
        for source in &copy.sources {
            let relative = source.trim_start_matches("./").trim_end_matches('/');
            let from = root.join(relative);
            if !from.exists() {
                return Err(format!("COPY {arguments}: {source} is not in the build context"));
            }
            // Docker copies a folder's contents, a file as itself.
            let to = if into_folder && !from.is_dir() {
                dir.join(destination)
                    .join(relative.rsplit('/').next().unwrap_or(relative))
            } else {
                dir.join(destination)
            };
            collect(&from, &to, relative, &ignored, &mut files)?;
        }
    }
    sync(dir, &files)
}

/// Runs the build stage's `RUN` lines in `dir` with `sh -c`, in an
/// environment free of this test run's cargo settings (as a fresh container
/// would be), and returns the combined output or what failed.
/// Cargo's per-profile overrides (the Cargo book, "Profiles", environment
/// variables `CARGO_PROFILE_<name>_<key>`) that make the release build an
/// unoptimised one. `panic = "abort"` and `strip` stay as Cargo.toml says.
pub const QUICK_RELEASE: [(&str, &str); 3] = [
    ("CARGO_PROFILE_RELEASE_OPT_LEVEL", "0"),
    ("CARGO_PROFILE_RELEASE_LTO", "off"),
    ("CARGO_PROFILE_RELEASE_CODEGEN_UNITS", "256"),
];

pub fn run_build(build: &Stage, dir: &Path) -> Result<String, String> {
    let mut output = String::new();
    for command in build.all("RUN") {
        let mut sh = Command::new("sh");
        sh.arg("-c")
            .arg(command)
            .current_dir(dir)
            .env_clear()
            .envs(QUICK_RELEASE);
        for keep in ["PATH", "HOME", "CARGO_HOME", "RUSTUP_HOME", "RUSTUP_TOOLCHAIN"] {
            if let Some(value) = std::env::var_os(keep) {
                sh.env(keep, value);
            }
        }
        let done = sh.output().map_err(|e| format!("cannot run sh: {e}"))?;
        output.push_str(&String::from_utf8_lossy(&done.stdout));
        output.push_str(&String::from_utf8_lossy(&done.stderr));
        if !done.status.success() {
            return Err(format!("RUN {command} failed ({}):\n{output}", done.status));
        }
    }
    Ok(output)
}

/// Builds the image's binary as the Dockerfile does and returns where the
/// final stage's `COPY --from` takes it from (in the build folder), with
/// its destination in the image.
pub fn build_image_binary() -> Result<(PathBuf, String), String> {
    let text = fs::read_to_string(root().join("Dockerfile")).map_err(|e| format!("Dockerfile: {e}"))?;
    let stages = parse(&text)?;
    let (_, build, copy) = image_and_build_stage(&stages, None)?;
    let dir = build_dir();
    prepare_context(&build, &dir)?;
    run_build(&build, &dir)?;
    let workdir = build.last("WORKDIR").unwrap_or("/");
    let [source] = copy.sources.as_slice() else {
        return Err(format!(
            "COPY --from copies {} files; one binary expected",
            copy.sources.len()
        ));
    };
    let built = dir.join(source.trim_start_matches(workdir).trim_start_matches('/'));
    Ok((built, copy.destination))
}
