//! Reading a GGUF file: header, metadata and tensors, with errors that name the file and key.

use std::collections::HashMap;
use std::fs::File;
use std::io::{BufReader, Read};
use std::path::{Path, PathBuf};

use candle_core::quantized::gguf_file::{Content, Value};
use candle_core::quantized::QTensor;
use candle_core::Device;
use sha2::{Digest, Sha256};

use crate::error::{Error, Result};

/// An opened GGUF file: its parsed header and a reader for tensor data.
pub struct GgufFile {
    path: PathBuf,
    content: Content,
    reader: BufReader<File>,
}

impl GgufFile {
    pub fn open(path: &Path) -> Result<Self> {
        let file = File::open(path).map_err(|source| Error::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut reader = BufReader::new(file);
        let content = Content::read(&mut reader).map_err(|e| Error::Gguf {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        Ok(Self {
            path: path.to_path_buf(),
            content,
            reader,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    pub fn metadata(&self) -> &HashMap<String, Value> {
        &self.content.metadata
    }

    pub fn has_tensor(&self, name: &str) -> bool {
        self.content.tensor_infos.contains_key(name)
    }

    /// Names and element counts of every tensor.
    pub fn tensor_sizes(&self) -> impl Iterator<Item = (&str, usize)> {
        self.content
            .tensor_infos
            .iter()
            .map(|(name, info)| (name.as_str(), info.shape.elem_count()))
    }

    /// Tensor names in the order their data lies in the file.
    pub fn tensor_names_in_file_order(&self) -> Vec<String> {
        let mut infos: Vec<(&String, u64)> = self
            .content
            .tensor_infos
            .iter()
            .map(|(name, info)| (name, info.offset))
            .collect();
        infos.sort_by_key(|(_, offset)| *offset);
        infos.into_iter().map(|(name, _)| name.clone()).collect()
    }

    /// Count of tensors per storage type, e.g. `Q4_1: 210`.
    pub fn tensor_types(&self) -> Vec<(String, usize)> {
        let mut counts: HashMap<String, usize> = HashMap::new();
        for info in self.content.tensor_infos.values() {
            *counts.entry(format!("{:?}", info.ggml_dtype)).or_default() += 1;
        }
        let mut counts: Vec<_> = counts.into_iter().collect();
        counts.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        counts
    }

    pub fn tensor(&mut self, name: &str, device: &Device) -> Result<QTensor> {
        if !self.has_tensor(name) {
            return Err(self.gguf_error(format!("tensor `{name}` is missing")));
        }
        self.content
            .tensor(&mut self.reader, name, device)
            .map_err(|e| Error::Gguf {
                path: self.path.clone(),
                message: format!("tensor `{name}`: {e}"),
            })
    }

    pub fn gguf_error(&self, message: String) -> Error {
        Error::Gguf {
            path: self.path.clone(),
            message,
        }
    }

    fn key_error(&self, key: &str, problem: impl Into<String>) -> Error {
        Error::Metadata {
            path: self.path.clone(),
            key: key.to_string(),
            problem: problem.into(),
        }
    }

    pub fn get(&self, key: &str) -> Option<&Value> {
        self.content.metadata.get(key)
    }

    fn required(&self, key: &str) -> Result<&Value> {
        self.get(key)
            .ok_or_else(|| self.key_error(key, "is missing"))
    }

    pub fn string(&self, key: &str) -> Result<&str> {
        match self.required(key)? {
            Value::String(s) => Ok(s),
            other => Err(self.key_error(key, format!("should be a string, found {other:?}"))),
        }
    }

    pub fn opt_string(&self, key: &str) -> Result<Option<&str>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.string(key).map(Some),
        }
    }

    pub fn usize(&self, key: &str) -> Result<usize> {
        let v = self.required(key)?;
        as_u64(v)
            .and_then(|v| usize::try_from(v).ok())
            .ok_or_else(|| {
                self.key_error(key, format!("should be an unsigned integer, found {v:?}"))
            })
    }

    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.usize(key).map(Some),
        }
    }

    pub fn f32(&self, key: &str) -> Result<f32> {
        let v = self.required(key)?;
        match v {
            Value::F32(x) => Ok(*x),
            Value::F64(x) => Ok(*x as f32),
            _ => as_u64(v)
                .map(|x| x as f32)
                .ok_or_else(|| self.key_error(key, format!("should be a number, found {v:?}"))),
        }
    }

    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>> {
        match self.get(key) {
            None => Ok(None),
            Some(_) => self.f32(key).map(Some),
        }
    }

    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Bool(b)) => Ok(Some(*b)),
            Some(other) => {
                Err(self.key_error(key, format!("should be a boolean, found {other:?}")))
            }
        }
    }

    pub fn string_array(&self, key: &str) -> Result<Vec<&str>> {
        match self.required(key)? {
            Value::Array(items) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::String(s) => Ok(s.as_str()),
                    other => Err(self
                        .key_error(key, format!("item {i} should be a string, found {other:?}"))),
                })
                .collect(),
            other => Err(self.key_error(key, format!("should be an array, found {other:?}"))),
        }
    }

    pub fn opt_f32_array(&self, key: &str) -> Result<Option<Vec<f32>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| match v {
                    Value::F32(x) => Ok(*x),
                    Value::F64(x) => Ok(*x as f32),
                    other => Err(self
                        .key_error(key, format!("item {i} should be a number, found {other:?}"))),
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(other) => Err(self.key_error(key, format!("should be an array, found {other:?}"))),
        }
    }

    pub fn opt_int_array(&self, key: &str) -> Result<Option<Vec<i64>>> {
        match self.get(key) {
            None => Ok(None),
            Some(Value::Array(items)) => items
                .iter()
                .enumerate()
                .map(|(i, v)| {
                    as_i64(v).ok_or_else(|| {
                        self.key_error(key, format!("item {i} should be an integer, found {v:?}"))
                    })
                })
                .collect::<Result<Vec<_>>>()
                .map(Some),
            Some(other) => Err(self.key_error(key, format!("should be an array, found {other:?}"))),
        }
    }
}

fn as_u64(v: &Value) -> Option<u64> {
    match *v {
        Value::U8(x) => Some(x.into()),
        Value::U16(x) => Some(x.into()),
        Value::U32(x) => Some(x.into()),
        Value::U64(x) => Some(x),
        Value::I8(x) => u64::try_from(x).ok(),
        Value::I16(x) => u64::try_from(x).ok(),
        Value::I32(x) => u64::try_from(x).ok(),
        Value::I64(x) => u64::try_from(x).ok(),
        _ => None,
    }
}

fn as_i64(v: &Value) -> Option<i64> {
    match *v {
        Value::I8(x) => Some(x.into()),
        Value::I16(x) => Some(x.into()),
        Value::I32(x) => Some(x.into()),
        Value::I64(x) => Some(x),
        _ => as_u64(v).and_then(|x| i64::try_from(x).ok()),
    }
}

/// Hex sha256 of a file, read in 1 MiB pieces.
pub fn sha256_file(path: &Path) -> Result<String> {
    let io = |source| Error::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut file = File::open(path).map_err(io)?;
    let mut hasher = Sha256::new();
    let mut buf = vec![0u8; 1 << 20];
    loop {
        let n = file.read(&mut buf).map_err(io)?;
        if n == 0 {
            break;
        }
        hasher.update(&buf[..n]);
    }
    Ok(hasher
        .finalize()
        .iter()
        .map(|b| format!("{b:02x}"))
        .collect())
}
