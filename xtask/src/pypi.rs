//! Programs nobody here wrote, from PyPI, for the fidelity tests (`tests/tests/fidelity.rs`):
//! black, sympy, pytest and pandas (with numpy and its OpenBLAS) in a virtual environment of
//! pyenv's 3.12 under `.tools/pypi`. Versions are pinned, so a test run profiles the same code
//! every time; a new pin rebuilds the environment.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result};

use super::{quiet_ok, run};

const REQUIREMENTS: &str = "black==26.10.1\nsympy==1.14.0\nmpmath==1.3.0\npytest==9.2.0\n\
                            pandas==3.1.1\nnumpy==2.5.5\n";
const BASE: &str = ".pyenv/versions/3.12.1/bin/python3";

/// `.tools/pypi/venv`, set up if needed (idempotent; about half a minute the first time).
pub fn setup(tools: &Path) -> Result<PathBuf> {
    pinned_venv(
        &tools.join("pypi"),
        REQUIREMENTS,
        &["-c", "import black, sympy, pytest, pandas"],
        "black, sympy, pytest and pandas",
    )
}

/// `DIR/venv`, a virtual environment of pyenv's 3.12 with the pinned `requirements`, made anew
/// unless its pins are these and `python probe` succeeds in it (idempotent).
pub fn pinned_venv(dir: &Path, requirements: &str, probe: &[&str], what: &str) -> Result<PathBuf> {
    let venv = dir.join("venv");
    let python = venv.join("bin/python");
    let pinned = dir.join("requirements.txt");
    let current = std::fs::read_to_string(&pinned).unwrap_or_default() == requirements;
    if current && quiet_ok(Command::new(&python).args(probe)) {
        return Ok(venv);
    }
    eprintln!("xtask: installing {what} from PyPI into {}", dir.display());
    let home = std::env::var("HOME").context("HOME")?;
    let _ = std::fs::remove_dir_all(dir);
    std::fs::create_dir_all(dir)?;
    let req = dir.join("requirements.in");
    std::fs::write(&req, requirements)?;
    run(Command::new(Path::new(&home).join(BASE))
        .args(["-m", "venv"])
        .arg(&venv))?;
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "-r",
        ])
        .arg(&req))?;
    // Written last: an interrupted install is redone.
    std::fs::write(&pinned, requirements)?;
    Ok(venv)
}

/// The official generated code of OpenTelemetry's protocol (PyPI's `opentelemetry-proto`),
/// which the OTLP export test decodes the requests with, in `.tools/otlp/venv` (idempotent).
pub fn otlp(tools: &Path) -> Result<PathBuf> {
    pinned_venv(
        &tools.join("otlp"),
        "opentelemetry-proto==1.45.2\nprotobuf==6.33.6\n",
        &[
            "-c",
            "import opentelemetry.proto.collector.profiles.v1development.profiles_service_pb2",
        ],
        "opentelemetry-proto",
    )
}

/// uvloop for Debian's 3.14 (the asyncio tests run it), from PyPI's wheel, unpacked under
/// `.tools/uvloop` for a test to put on `sys.path` (idempotent).
pub fn uvloop(tools: &Path, venv: &Path) -> Result<PathBuf> {
    const WHEEL: &str = "uvloop==0.23.0";
    let dir = tools.join("uvloop");
    let pinned = dir.join("pinned.txt");
    if std::fs::read_to_string(&pinned).unwrap_or_default() == WHEEL
        && dir.join("uvloop/__init__.py").exists()
    {
        return Ok(dir);
    }
    eprintln!("xtask: fetching {WHEEL} for Python 3.14 from PyPI into .tools/uvloop");
    let _ = std::fs::remove_dir_all(&dir);
    let wheels = dir.join("wheels");
    std::fs::create_dir_all(&wheels)?;
    let python = venv.join("bin/python");
    run(Command::new(&python)
        .args([
            "-m",
            "pip",
            "download",
            "-q",
            "--disable-pip-version-check",
            "--no-deps",
            "--only-binary=:all:",
            "--python-version",
            "3.14",
            "--platform",
            "manylinux_2_17_x86_64",
            "-d",
        ])
        .arg(&wheels)
        .arg(WHEEL))?;
    for w in std::fs::read_dir(&wheels)? {
        run(Command::new(&python)
            .args(["-m", "zipfile", "-e"])
            .arg(w?.path())
            .arg(&dir))?;
    }
    std::fs::write(&pinned, WHEEL)?;
    Ok(dir)
}
