//! Refusing weights that are not finite. A quantized block is its values times a scale
//! (and an offset): one NaN or infinite scale turns every logit it reaches into NaN,
//! and a model that loads anyway answers garbage with no error. So each tensor's
//! scales (every value, for float formats) are checked as it is loaded.

use candle_core::quantized::GgmlDType;

/// A float field's width and where its exponent bits lie.
#[derive(Clone, Copy)]
enum Float {
    F16,
    Bf16,
    F32,
}

impl Float {
    fn bytes(self) -> usize {
        match self {
            Float::F16 | Float::Bf16 => 2,
            Float::F32 => 4,
        }
    }

    /// Whether the value at the start of `b` (little-endian) is NaN or infinite: its
    /// exponent bits all set.
    fn non_finite(self, b: &[u8]) -> bool {
        match self {
            Float::F16 => u16::from_le_bytes([b[0], b[1]]) & 0x7c00 == 0x7c00,
            Float::Bf16 => u16::from_le_bytes([b[0], b[1]]) & 0x7f80 == 0x7f80,
            Float::F32 => u32::from_le_bytes([b[0], b[1], b[2], b[3]]) & 0x7f80_0000 == 0x7f80_0000,
        }
    }
}

/// A format's blocks: bytes per block, and the offsets and type of the floats in each
/// that scale its values (for float formats, a block is one value).
fn scales_of(dtype: GgmlDType) -> (usize, &'static [usize], Float) {
    use GgmlDType::*;
    match dtype {
        F32 => (4, &[0], Float::F32),
        F16 => (2, &[0], Float::F16),
        BF16 => (2, &[0], Float::Bf16),
        Q4_0 => (18, &[0], Float::F16),
        Q4_1 => (20, &[0, 2], Float::F16),
        Q5_0 => (22, &[0], Float::F16),
        Q5_1 => (24, &[0, 2], Float::F16),
        Q8_0 => (34, &[0], Float::F16),
        Q8_1 => (36, &[0, 2], Float::F16),
        Q2K => (84, &[80, 82], Float::F16),
        Q3K => (110, &[108], Float::F16),
        Q4K => (144, &[0, 2], Float::F16),
        Q5K => (176, &[0, 2], Float::F16),
        Q6K => (210, &[208], Float::F16),
        Q8K => (292, &[0], Float::F32),
    }
}

/// The first block (for float formats, value) of `data`, a tensor in format `dtype`,
/// whose scale is NaN or infinite; None when all are finite.
pub(super) fn first_non_finite(dtype: GgmlDType, data: &[u8]) -> Option<usize> {
    let (block, offsets, float) = scales_of(dtype);
    data.chunks_exact(block).position(|b| {
        offsets
            .iter()
            .any(|&at| float.non_finite(&b[at..at + float.bytes()]))
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use candle_core::quantized::QTensor;
    use candle_core::{Device, Tensor};

    /// Quantized from finite values, every format's scales are finite; a NaN or an
    /// infinity written into one block's scale (or one float value) is found there.
    #[test]
    fn a_non_finite_scale_is_found_in_its_block() {
        let values: Vec<f32> = (0..1024)
            .map(|i| ((i * 37) % 101) as f32 / 50.0 - 1.0)
            .collect();
        let t = Tensor::from_vec(values, (4, 256), &Device::Cpu).unwrap();
        use GgmlDType::*;
        for dtype in [
            F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2K, Q3K, Q4K, Q5K, Q6K,
        ] {
            let q = QTensor::quantize(&t, dtype).unwrap();
            let mut data = q.data().unwrap().into_owned();
            let (block, offsets, float) = scales_of(dtype);
            assert_eq!(data.len() % block, 0, "{dtype:?}");
            assert_eq!(first_non_finite(dtype, &data), None, "{dtype:?}");
            let blocks = data.len() / block;
            let bad = blocks / 2 + 1;
            for &at in offsets {
                for pattern in [f32::NAN, f32::INFINITY, f32::NEG_INFINITY] {
                    let mut damaged = data.clone();
                    let at = bad * block + at;
                    match float {
                        Float::F16 => damaged[at..at + 2]
                            .copy_from_slice(&half::f16::from_f32(pattern).to_le_bytes()),
                        Float::Bf16 => damaged[at..at + 2]
                            .copy_from_slice(&half::bf16::from_f32(pattern).to_le_bytes()),
                        Float::F32 => damaged[at..at + 4].copy_from_slice(&pattern.to_le_bytes()),
                    }
                    assert_eq!(first_non_finite(dtype, &damaged), Some(bad), "{dtype:?}");
                }
            }
            // The largest finite scale is finite.
            let at = offsets[0];
            match float {
                Float::F16 => data[at..at + 2].copy_from_slice(&half::f16::MAX.to_le_bytes()),
                Float::Bf16 => data[at..at + 2].copy_from_slice(&half::bf16::MAX.to_le_bytes()),
                Float::F32 => data[at..at + 4].copy_from_slice(&f32::MAX.to_le_bytes()),
            }
            assert_eq!(first_non_finite(dtype, &data), None, "{dtype:?}");
        }
    }
}
