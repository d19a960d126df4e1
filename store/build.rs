// The PostgreSQL schema's migrations are embedded at compile time (refinery): a new or
// changed migration file rebuilds the store.
fn main() {
    println!("cargo:rerun-if-changed=../migrations/postgres");
}
