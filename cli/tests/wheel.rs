//! `pip install mneme`: `scripts/wheel.sh` packs the binary cargo built for
//! this test (no second build) into a wheel; it is installed into a fresh
//! virtual environment under target/, `mneme demo` runs from the
//! environment's bin directory, and `pip uninstall` takes it away again.
//! python3 and its venv module come from Debian's packages where missing
//! (`scripts/python3.sh`); pip installs from the wheel alone, no index.

mneme_e2e::binary!(env!("CARGO_BIN_EXE_mneme"));

use mneme_e2e::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn run(command: &mut Command) -> Output {
    let output = command
        .output()
        .unwrap_or_else(|e| panic!("{command:?}: {e}"));
    assert!(
        output.status.success(),
        "{command:?} failed:\n{}\n{}",
        stdout(&output),
        stderr(&output)
    );
    output
}

fn python3() -> PathBuf {
    let script = repo_root().join("scripts/python3.sh");
    let output = run(Command::new("bash").arg(&script));
    PathBuf::from(stdout(&output).trim())
}

/// Checks the wheel as pip's RECORD rules say: every file listed with its
/// SHA-256 (urlsafe base64, unpadded) and size, RECORD itself without; and
/// the binary executable. Prints the wheel's tag.
const CHECK_WHEEL: &str = r#"
import base64, hashlib, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as zf:
    names = set(zf.namelist())
    record = [n for n in names if n.endswith(".dist-info/RECORD")]
    assert len(record) == 1, names
    listed = set()
    for line in zf.read(record[0]).decode().splitlines():
        path, digest, size = line.rsplit(",", 2)
        listed.add(path)
        if path == record[0]:
            assert (digest, size) == ("", ""), line
            continue
        data = zf.read(path)
        sha = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == "sha256=" + sha and int(size) == len(data), line
    assert listed == names, (listed, names)
    script = [n for n in names if n.endswith(".data/scripts/mneme")]
    assert len(script) == 1, names
    assert (zf.getinfo(script[0]).external_attr >> 16) & 0o111, "not executable"
    wheel = [n for n in names if n.endswith(".dist-info/WHEEL")][0]
    print([l for l in zf.read(wheel).decode().splitlines() if l.startswith("Tag: ")][0][5:])
"#;

#[test]
fn the_wheel_installs_mneme_into_a_fresh_venv_where_its_demo_runs() {
    let root = repo_root();
    let bin = mneme_bin();
    let python = python3();
    let scratch = root
        .join("target/wheel-test")
        .join(std::process::id().to_string());
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch).unwrap();

    // The wheel, from the binary this test was built with.
    let out = run(Command::new("bash")
        .arg(root.join("scripts/wheel.sh"))
        .arg(&bin)
        .arg("--out")
        .arg(scratch.join("wheels")));
    let wheel = PathBuf::from(stdout(&out).lines().last().unwrap().trim());
    let name = wheel.file_name().unwrap().to_str().unwrap().to_string();
    let version = env!("CARGO_PKG_VERSION");
    let arch = std::env::consts::ARCH;
    assert!(
        name.starts_with(&format!("mneme-{version}-py3-none-"))
            && name.ends_with(&format!("_{arch}.whl")),
        "{name}"
    );
    let tag = run(Command::new(&python).args(["-c", CHECK_WHEEL]).arg(&wheel));
    let tag = stdout(&tag).trim().to_string();
    assert!(name.contains(&tag), "{name} is tagged {tag}");
    let platform = tag.strip_prefix("py3-none-").unwrap();
    assert!(
        platform == format!("linux_{arch}")
            || (platform.starts_with("manylinux_2_") && platform.ends_with(arch)),
        "{platform}"
    );

    // A fresh virtual environment, and the wheel installed from its file.
    let venv = scratch.join("venv");
    run(Command::new(&python).args(["-m", "venv"]).arg(&venv));
    let venv_bin = venv.join("bin");
    run(Command::new(venv_bin.join("pip"))
        .args(["install", "--no-index", "--disable-pip-version-check"])
        .arg(&wheel));
    let installed = venv_bin.join("mneme");
    assert!(
        same_bytes(&installed, &bin),
        "the installed mneme is the binary cargo built"
    );

    // `mneme demo`, found on the environment's PATH as a user would.
    let path = format!(
        "{}:{}",
        venv_bin.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    let version_out = run(Command::new("mneme").arg("--version").env("PATH", &path));
    assert!(
        stdout(&version_out).contains(version),
        "{}",
        stdout(&version_out)
    );
    let demo = run(Command::new("mneme")
        .arg("demo")
        .env("PATH", &path)
        .env_remove("MNEME_CRASH_AT")
        .current_dir(&scratch));
    let told = stdout(&demo);
    assert!(
        told.contains("Every side effect happened exactly once, across a SIGKILL and a resume."),
        "{told}"
    );
    // The sink's counts: the email was sent again after the kill, with
    // its key, and applied once; the charge was never sent again.
    let counts: Vec<String> = told
        .lines()
        .filter(|l| l.trim_start().starts_with('/'))
        .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
        .collect();
    let last = &counts[counts.len() - 2..];
    assert_eq!(
        last,
        [
            "/charge requests 1 effects applied 1",
            "/email requests 2 effects applied 1"
        ],
        "{told}"
    );

    // And uninstalled: gone from the environment.
    run(Command::new(venv_bin.join("pip")).args([
        "uninstall",
        "-y",
        "--disable-pip-version-check",
        "mneme",
    ]));
    assert!(!installed.exists(), "{} is left", installed.display());
    std::fs::remove_dir_all(&scratch).unwrap();
}

/// Whether two files hold the same bytes.
fn same_bytes(a: &Path, b: &Path) -> bool {
    use std::io::Read;
    let (mut a, mut b) = (
        std::fs::File::open(a).unwrap(),
        std::fs::File::open(b).unwrap(),
    );
    if a.metadata().unwrap().len() != b.metadata().unwrap().len() {
        return false;
    }
    let (mut x, mut y) = (vec![0u8; 1 << 20], vec![0u8; 1 << 20]);
    loop {
        let n = a.read(&mut x).unwrap();
        if n == 0 {
            return true;
        }
        b.read_exact(&mut y[..n]).unwrap();
        if x[..n] != y[..n] {
            return false;
        }
    }
}
