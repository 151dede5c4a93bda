// What the tests of a crate need that a machine may lack: a wgpu adapter, a browser, a Python
// with the client libraries. Each crate's build.rs includes this file and calls `declare` with
// the needs its tests have. For each need it sets the cfg `no_<need>` when the machine lacks it,
// so the tests that need it are marked `#[cfg_attr(no_<need>, ignore = "...")]` and the test
// runner reports them as ignored, never as passed. Under CI (`CI` set) nothing is ever missing
// here: the tests run, and fail when what they need is not there. What was found (the browser's
// path, the Python) is handed to the tests in `TINYGPT_TEST_CHROMIUM` and
// `TINYGPT_TEST_CLIENT_PYTHON` (`env!`), empty where nothing was: the one search for each.
//
// Found when the crate is built: after installing what was missing, rebuild (`touch` the
// crate's build.rs) for the tests to run.

use std::path::{Path, PathBuf};

/// What a test may need.
#[allow(dead_code)] // Each crate needs its own share.
#[derive(Clone, Copy)]
enum Need {
    /// A Vulkan driver (a GPU's, or Mesa's lavapipe) for wgpu; Metal and DX12 always are.
    Wgpu,
    /// Chromium for the browser tests (`TINYGPT_CHROMIUM`, or `chromium` on the PATH).
    Chromium,
    /// A Python with `openai`, `langchain_openai` and `gguf` (`TINYGPT_CLIENTS_PYTHON`, or
    /// `python3`).
    ClientPython,
}

impl Need {
    fn cfg(self) -> &'static str {
        match self {
            Need::Wgpu => "no_wgpu",
            Need::Chromium => "no_chromium",
            Need::ClientPython => "no_client_python",
        }
    }

    /// What was found, if anything: a Vulkan driver, a browser's path, a Python.
    fn found(self) -> Option<String> {
        match self {
            Need::Wgpu => vulkan_driver().then(String::new),
            Need::Chromium => chromium().map(|p| p.display().to_string()),
            Need::ClientPython => client_python(),
        }
    }

    /// The variable the tests read what was found from.
    fn env(self) -> Option<&'static str> {
        match self {
            Need::Wgpu => None,
            Need::Chromium => Some("TINYGPT_TEST_CHROMIUM"),
            Need::ClientPython => Some("TINYGPT_TEST_CLIENT_PYTHON"),
        }
    }
}

fn declare(needs: &[Need]) {
    println!("cargo::rerun-if-changed=build.rs");
    println!("cargo::rerun-if-changed=../test-needs.rs");
    for var in [
        "CI",
        "TINYGPT_CHROMIUM",
        "TINYGPT_CLIENTS_PYTHON",
        "VK_DRIVER_FILES",
        "VK_ICD_FILENAMES",
        "VK_ADD_DRIVER_FILES",
    ] {
        println!("cargo::rerun-if-env-changed={var}");
    }
    let ci = std::env::var_os("CI").is_some_and(|v| !v.is_empty());
    for &need in needs {
        println!("cargo::rustc-check-cfg=cfg({})", need.cfg());
        let found = need.found();
        if let Some(var) = need.env() {
            println!("cargo::rustc-env={var}={}", found.clone().unwrap_or_default());
        }
        if !ci && found.is_none() {
            println!("cargo::rustc-cfg={}", need.cfg());
        }
    }
}

/// Whether a Vulkan driver's manifest (an ICD) is where the Vulkan loader looks, on Linux and
/// the BSDs; other systems have Metal or DX12.
fn vulkan_driver() -> bool {
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    if matches!(os.as_str(), "macos" | "ios" | "windows") {
        return true;
    }
    let exists = |var: &str| {
        std::env::var_os(var).map(|files| std::env::split_paths(&files).any(|f| f.exists()))
    };
    // These two replace the loader's search; the third adds to it.
    if let Some(found) = exists("VK_DRIVER_FILES").or_else(|| exists("VK_ICD_FILENAMES")) {
        return found;
    }
    if exists("VK_ADD_DRIVER_FILES") == Some(true) {
        return true;
    }
    let home = std::env::var_os("HOME").map(PathBuf::from);
    let config = std::env::var("XDG_CONFIG_DIRS").unwrap_or_else(|_| "/etc/xdg".into());
    let data = std::env::var("XDG_DATA_DIRS").unwrap_or_else(|_| "/usr/local/share:/usr/share".into());
    let mut dirs: Vec<PathBuf> = std::env::split_paths(&config)
        .chain(std::env::split_paths(&data))
        .chain([PathBuf::from("/etc"), PathBuf::from("/usr/share")])
        .collect();
    dirs.extend(home.map(|h| h.join(".local/share")));
    dirs.iter()
        .map(|d| d.join("vulkan/icd.d"))
        .filter(|d| d.is_dir())
        .inspect(|d| println!("cargo::rerun-if-changed={}", d.display()))
        .any(|d| has_json(&d))
}

fn has_json(dir: &Path) -> bool {
    std::fs::read_dir(dir).is_ok_and(|entries| {
        entries
            .flatten()
            .any(|e| e.path().extension().is_some_and(|x| x == "json"))
    })
}

/// The browser the tests drive.
fn chromium() -> Option<PathBuf> {
    if let Some(path) = std::env::var_os("TINYGPT_CHROMIUM") {
        return Some(path.into());
    }
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| ["chromium", "chromium-browser"].map(|name| dir.join(name)))
        .find(|p| p.is_file())
}

/// The Python the client tests drive the server with, if it has the client libraries.
fn client_python() -> Option<String> {
    let python = std::env::var("TINYGPT_CLIENTS_PYTHON").unwrap_or_else(|_| "python3".into());
    std::process::Command::new(&python)
        .args(["-c", "import openai, langchain_openai, gguf"])
        .output()
        .is_ok_and(|out| out.status.success())
        .then_some(python)
}
