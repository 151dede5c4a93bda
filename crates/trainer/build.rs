//! Marks the tests that need a wgpu adapter, Chromium or the Python client libraries as ignored
//! on a machine without them (see `../test-needs.rs`).

include!("../test-needs.rs");

fn main() {
    declare(&[Need::Wgpu, Need::Chromium, Need::ClientPython]);
}
