//! Choosing where the model runs.

use candle_core::Device;

use crate::error::{Error, Result};

/// Opens the device named `cpu`, `cuda` (or `cuda:N`) or `metal`. A GPU device the binary
/// was not built for is an error that says which cargo feature adds it.
pub fn open_device(name: &str) -> Result<Device> {
    let (kind, ordinal) = match name.split_once(':') {
        Some((kind, n)) => (
            kind,
            n.parse::<usize>()
                .map_err(|_| Error::UnknownDevice(name.to_string()))?,
        ),
        None => (name, 0),
    };
    match kind {
        "cpu" => Ok(Device::Cpu),
        "cuda" if cfg!(feature = "cuda") => Ok(Device::new_cuda(ordinal)?),
        "metal" if cfg!(feature = "metal") => Ok(Device::new_metal(ordinal)?),
        "cuda" | "metal" => Err(Error::DeviceNotBuilt(kind.to_string())),
        _ => Err(Error::UnknownDevice(name.to_string())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_opens_and_unknown_names_are_refused() {
        assert!(open_device("cpu").unwrap().is_cpu());
        assert!(matches!(open_device("tpu"), Err(Error::UnknownDevice(_))));
        assert!(matches!(
            open_device("cuda:x"),
            Err(Error::UnknownDevice(_))
        ));
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_names_the_feature() {
        let err = open_device("cuda").unwrap_err().to_string();
        assert!(err.contains("--features cuda"), "{err}");
    }
}
