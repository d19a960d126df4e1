//! v1 → v2: an index from stream id to stream name (tree `stream_names`, key the id as
//! big-endian u64, value the name's UTF-8 bytes), so that records keyed by id (log,
//! chunks, versions) can be traced back to their stream.
//!
//! v1 `streams`: key the name, value a format byte 1 then postcard `(id: u64, name:
//! String, …)`; only the leading id and name are read here.

use super::Changes;

pub fn run(changes: &mut Changes<'_>) -> Result<(), String> {
    for (key, value) in changes.scan("streams").map_err(|e| e.to_string())? {
        let name = String::from_utf8_lossy(&key).into_owned();
        let body = match value.split_first() {
            Some((1, body)) => body,
            Some((v, _)) => return Err(format!("streams/{name}: unknown format version {v}")),
            None => return Err(format!("streams/{name}: empty value")),
        };
        let ((id, _stored_name), _rest): ((u64, String), _) =
            postcard::take_from_bytes(body).map_err(|e| format!("streams/{name}: {e}"))?;
        changes.insert("stream_names", id.to_be_bytes().to_vec(), key);
    }
    Ok(())
}
