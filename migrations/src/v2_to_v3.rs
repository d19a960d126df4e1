//! v2 → v3: content logs leave the database for files beside it (`logs/<stream id>.log`
//! in the data directory), moved there by the store when it opens the database; the
//! `log` tree stays, empty. Nothing inside the database changes here: the version is
//! what keeps a memctl that reads logs from the `log` tree from opening a database whose
//! logs it cannot see ("newer than this memctl understands; upgrade memagent").

use super::Changes;

pub fn run(_changes: &mut Changes<'_>) -> Result<(), String> {
    Ok(())
}
