//! Record encoding: a format version byte, then postcard. Keys are big-endian so that
//! they sort in numeric order.

use serde::de::DeserializeOwned;
use serde::Serialize;

use crate::error::{Error, Result};

/// Format byte of every record this binary writes.
pub const FORMAT: u8 = 1;

pub fn encode<T: Serialize>(value: &T) -> Vec<u8> {
    let mut out = vec![FORMAT];
    // Encoding into a Vec fails only for types postcard cannot represent, which the
    // records of this crate are not.
    out.extend(postcard::to_allocvec(value).expect("records encode with postcard"));
    out
}

pub fn decode<T: DeserializeOwned>(tree: &'static str, key: &[u8], bytes: &[u8]) -> Result<T> {
    match bytes.split_first() {
        None => Err(Error::Corrupt {
            tree,
            key: show_key(key),
            reason: "empty value".to_string(),
        }),
        Some((&FORMAT, body)) => postcard::from_bytes(body).map_err(|e| Error::Corrupt {
            tree,
            key: show_key(key),
            reason: format!("{e} ({} bytes)", bytes.len()),
        }),
        Some((&version, _)) => Err(Error::UnknownFormat {
            tree,
            key: show_key(key),
            version,
        }),
    }
}

/// A key as people read it: numbers for the 8-byte big-endian parts of binary keys.
pub fn show_key(key: &[u8]) -> String {
    if !key.is_empty() && std::str::from_utf8(key).is_ok_and(|s| !s.chars().any(char::is_control)) {
        return String::from_utf8_lossy(key).into_owned();
    }
    if key.len().is_multiple_of(8) && !key.is_empty() {
        return key
            .chunks(8)
            .map(|c| u64::from_be_bytes(c.try_into().expect("8 bytes")).to_string())
            .collect::<Vec<_>>()
            .join("/");
    }
    key.iter().map(|b| format!("{b:02x}")).collect()
}

pub fn key1(a: u64) -> [u8; 8] {
    a.to_be_bytes()
}

pub fn key2(a: u64, b: u64) -> [u8; 16] {
    let mut k = [0u8; 16];
    k[..8].copy_from_slice(&a.to_be_bytes());
    k[8..].copy_from_slice(&b.to_be_bytes());
    k
}

pub fn key3(a: u64, b: u64, c: u64) -> [u8; 24] {
    let mut k = [0u8; 24];
    k[..8].copy_from_slice(&a.to_be_bytes());
    k[8..16].copy_from_slice(&b.to_be_bytes());
    k[16..].copy_from_slice(&c.to_be_bytes());
    k
}

/// The `N` big-endian numbers of a key of `tree`, or an error naming the key when it is
/// not `N` numbers long.
pub fn key_parts<const N: usize>(tree: &'static str, key: &[u8]) -> Result<[u64; N]> {
    if key.len() != 8 * N {
        return Err(Error::Corrupt {
            tree,
            key: show_key(key),
            reason: format!("a key of {} bytes, expected {}", key.len(), 8 * N),
        });
    }
    let mut out = [0u64; N];
    for (n, part) in out.iter_mut().zip(key.chunks_exact(8)) {
        *n = u64::from_be_bytes(part.try_into().expect("8 bytes"));
    }
    Ok(out)
}
