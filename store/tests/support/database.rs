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
    let config: tokio_postgres::Config = server.parse().expect("MEMAGENT_TEST_DATABASE");
    let db = format!("memagent_{name}_{}", std::process::id());
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let (client, connection) = config.connect(tokio_postgres::NoTls).await.unwrap();
        tokio::spawn(connection);
        for sql in [
            format!("DROP DATABASE IF EXISTS {db}"),
            format!("CREATE DATABASE {db}"),
        ] {
            client.batch_execute(&sql).await.unwrap();
        }
    });
    let (user, host, port) = (
        config.get_user().unwrap_or("postgres"),
        match config.get_hosts().first() {
            Some(tokio_postgres::config::Host::Tcp(h)) => h.clone(),
            _ => "localhost".to_string(),
        },
        config.get_ports().first().copied().unwrap_or(5432),
    );
    let password = config
        .get_password()
        .map(|p| format!(":{}", String::from_utf8_lossy(p)))
        .unwrap_or_default();
    format!("postgres://{user}{password}@{host}:{port}/{db}")
}
