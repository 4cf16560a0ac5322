//! The sandbox helper as a binary of its own, for this crate's tests
//! (`toolwire` itself reaches it through a hidden subcommand).
fn main() {
    toolwire_sandbox::helper::main(std::env::args_os().skip(1))
}
