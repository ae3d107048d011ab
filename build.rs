//! Puts the commit the binary is built from into `ackproxy --version` and
//! the `ackproxy_build_info` series:
//! `ACKPROXY_GIT_COMMIT` when set (a Docker build, which has no `.git`,
//! passes it as a build argument), else `git rev-parse --short HEAD`, else
//! nothing (a source archive builds as well; the series says "unknown").

use std::path::Path;
use std::process::Command;

fn git(args: &[&str]) -> Option<String> {
    let out = Command::new("git").args(args).output().ok()?;
    if !out.status.success() {
        return None;
    }
    let text = String::from_utf8(out.stdout).ok()?.trim().to_string();
    (!text.is_empty()).then_some(text)
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-env-changed=ACKPROXY_GIT_COMMIT");
    let given = std::env::var("ACKPROXY_GIT_COMMIT")
        .ok()
        .filter(|c| !c.trim().is_empty());
    let commit = given.or_else(|| {
        let commit = git(&["rev-parse", "--short", "HEAD"])?;
        // Built again when HEAD moves: HEAD itself (a checkout), the
        // branch it points to (a commit), and packed-refs (where git may
        // keep that branch instead). Only files that exist: cargo would
        // run this script on every build for one that does not.
        let git_dir = git(&["rev-parse", "--git-dir"]);
        let common = git(&["rev-parse", "--git-common-dir"]);
        let branch = git(&["symbolic-ref", "-q", "HEAD"]);
        let mut watched = Vec::new();
        if let Some(d) = &git_dir {
            watched.push(Path::new(d).join("HEAD"));
        }
        if let Some(c) = common.as_ref().or(git_dir.as_ref()) {
            watched.push(Path::new(c).join("packed-refs"));
            if let Some(b) = &branch {
                watched.push(Path::new(c).join(b));
            }
        }
        for path in watched.iter().filter(|p| p.exists()) {
            println!("cargo:rerun-if-changed={}", path.display());
        }
        Some(commit)
    });
    let version = match &commit {
        Some(c) => format!(
            "{} (commit {c})",
            std::env::var("CARGO_PKG_VERSION").unwrap()
        ),
        None => std::env::var("CARGO_PKG_VERSION").unwrap(),
    };
    println!("cargo:rustc-env=ACKPROXY_VERSION={version}");
    // The `commit` label of ackproxy_build_info: a label is never absent.
    println!(
        "cargo:rustc-env=ACKPROXY_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
