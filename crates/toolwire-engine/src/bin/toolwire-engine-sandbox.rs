//! The sandbox helper as a binary of its own, for this crate's tests
//! (`toolwire` ships its own `toolwire-sandbox`; a name of this crate's
//! keeps the two apart in a shared target directory).
fn main() {
    toolwire_sandbox::helper::main(std::env::args_os().skip(1))
}
