//! A fresh PostgreSQL database for a test, on the server `MEMAGENT_TEST_DATABASE` names.
//! Shared by the store's tests and the daemon's (`cli/tests/daemon/shared.rs`).

/// A fresh, empty PostgreSQL database named for the test (dropped first if a run before
/// left it), on the server `MEMAGENT_TEST_DATABASE` names; its URL. `scripts/test`
/// starts a throwaway server and sets the variable.
#[allow(dead_code)] // the store's tests that use only the embedded database
pub fn fresh_database(name: &str) -> String {
    let server = std::env::var("MEMAGENT_TEST_DATABASE").unwrap_or_else(|_| {
        panic!(
            "MEMAGENT_TEST_DATABASE is not set: run the tests with scripts/test, which starts \
             a throwaway PostgreSQL, or set it to a server's URL (postgres://user@host:port/db)"
        )
    });
    let db = format!("memagent_{name}_{}", std::process::id());
    memagent_store::postgres::fresh_database(&server, &db).unwrap()
}
