//! `toolwire-sandbox`: the sandbox helper as a small executable of its
//! own, shipped next to `toolwire` (`cargo install` puts both in one
//! directory). Every command toolwire runs starts this helper (twice where
//! it makes a PID namespace), so it links only the sandbox crate: loading
//! it costs a fraction of loading `toolwire` itself. Where it is missing,
//! toolwire falls back to its own hidden `__sandbox` subcommand.
fn main() {
    toolwire_sandbox::helper::main(std::env::args_os().skip(1))
}
