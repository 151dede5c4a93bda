//! Marks the tests that need a wgpu adapter as ignored on a machine without one (see
//! `../test-needs.rs`).

include!("../test-needs.rs");

fn main() {
    declare(&[Need::Wgpu]);
}
