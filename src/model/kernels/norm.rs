//! The forward pass's per-row element-wise steps on the host: RMS normalization, the
//! residual addition, biases, per-head norms and rotary embeddings.
//!
//! Each row's result depends on that row alone, through the same operations in the same
//! order whatever the row count. Plain Rust arithmetic with no target features and no
//! fused multiply-adds, so every CPU gives the same bits, and the compiler vectorizes
//! the loops where it can.

use super::reduce_lanes;

/// `out[r] = x[r] / rms(x[r]) · weight` for each row of `x` (`rows × weight.len()`),
/// with `rms(v) = sqrt(mean(v²) + eps)` as llama defines it. The squares are summed in
/// eight lanes and reduced in the kernels' fixed order.
pub fn rms_norm(x: &[f32], weight: &[f32], eps: f32, out: &mut Vec<f32>) {
    let width = weight.len();
    assert!(
        width > 0 && x.len().is_multiple_of(width),
        "x is rows × weight.len()"
    );
    out.clear();
    out.resize(x.len(), 0.0);
    for (row, out) in x.chunks_exact(width).zip(out.chunks_exact_mut(width)) {
        let rms = rms_of(row, eps);
        for ((o, &v), &w) in out.iter_mut().zip(row).zip(weight) {
            *o = v / rms * w;
        }
    }
}

/// `sqrt(mean(v²) + eps)`, the squares summed in eight lanes and reduced in the kernels'
/// fixed order.
fn rms_of(row: &[f32], eps: f32) -> f32 {
    let mut lanes = [0f32; 8];
    let mut chunks = row.chunks_exact(8);
    for chunk in &mut chunks {
        for (lane, &v) in lanes.iter_mut().zip(chunk) {
            *lane += v * v;
        }
    }
    for (lane, &v) in lanes.iter_mut().zip(chunks.remainder()) {
        *lane += v * v;
    }
    (reduce_lanes(&lanes) / row.len() as f32 + eps).sqrt()
}

/// `x[r] += bias` for each row of `x` (`rows × bias.len()`): a projection's bias.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    assert!(
        !bias.is_empty() && x.len().is_multiple_of(bias.len()),
        "x is rows × bias.len()"
    );
    for row in x.chunks_exact_mut(bias.len()) {
        add_assign(row, bias);
    }
}

/// `x += y`, element by element: the residual connection.
pub fn add_assign(x: &mut [f32], y: &[f32]) {
    assert_eq!(x.len(), y.len(), "the same shape");
    for (x, &y) in x.iter_mut().zip(y) {
        *x += y;
    }
}

/// Which of a head's values RoPE rotates together.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum RopePairs {
    /// Values 2i and 2i + 1, as GGUF lays out llama's q and k.
    Adjacent,
    /// Values i and i + head_dim/2 (Hugging Face's `rotate_half`), as GGUF keeps them for
    /// Qwen and Gemma.
    Halves,
}

/// Rotary position embeddings for [`gather_heads`]: each row's position, and `cos` and
/// `sin` giving `head_dim / 2` values per position.
#[derive(Clone, Copy, Debug)]
pub struct Rotary<'a> {
    /// Each row's position.
    pub positions: &'a [u32],
    /// The cosines, `head_dim / 2` per position.
    pub cos: &'a [f32],
    /// The sines, laid out as the cosines.
    pub sin: &'a [f32],
    /// Which values are rotated together.
    pub pairs: RopePairs,
}

/// The heads in columns `from..from + heads · head_dim` of `rows` rows of `x` (`stride`
/// floats per row), gathered head-major into `out` (`[head][row][head_dim]`). With
/// `norm` (a weight of `head_dim` values and its epsilon), each head is RMS-normalized
/// on its own first (Qwen 3's and Gemma 3's q and k norms); with `rotary`, each head's
/// value pairs are then rotated by the angle of the row's position.
#[allow(clippy::too_many_arguments)]
pub fn gather_heads(
    x: &[f32],
    stride: usize,
    from: usize,
    heads: usize,
    head_dim: usize,
    norm: Option<(&[f32], f32)>,
    rotary: Option<Rotary<'_>>,
    out: &mut Vec<f32>,
) {
    let rows = x.len() / stride;
    assert_eq!(x.len(), rows * stride, "x is rows × stride");
    assert!(
        from + heads * head_dim <= stride,
        "the heads are inside a row"
    );
    assert!(head_dim.is_multiple_of(2), "head_dim is even");
    if let Some((weight, _)) = norm {
        assert_eq!(weight.len(), head_dim, "a head norm has head_dim weights");
    }
    out.clear();
    out.resize(heads * rows * head_dim, 0.0);
    let half = head_dim / 2;
    for (r, row) in x.chunks_exact(stride).enumerate() {
        for h in 0..heads {
            let src = &row[from + h * head_dim..][..head_dim];
            let dst = &mut out[(h * rows + r) * head_dim..][..head_dim];
            dst.copy_from_slice(src);
            if let Some((weight, eps)) = norm {
                let rms = rms_of(dst, eps);
                for (d, &w) in dst.iter_mut().zip(weight) {
                    *d = *d / rms * w;
                }
            }
            let Some(Rotary {
                positions,
                cos,
                sin,
                pairs,
            }) = rotary
            else {
                continue;
            };
            let at = positions[r] as usize * half;
            let (cos, sin) = (&cos[at..at + half], &sin[at..at + half]);
            let rotate = |x0: &mut f32, x1: &mut f32, c: f32, s: f32| {
                (*x0, *x1) = (*x0 * c - *x1 * s, *x0 * s + *x1 * c);
            };
            match pairs {
                RopePairs::Adjacent => {
                    for ((d, &c), &s) in dst.chunks_exact_mut(2).zip(cos).zip(sin) {
                        let [x0, x1] = d else { unreachable!() };
                        rotate(x0, x1, c, s);
                    }
                }
                RopePairs::Halves => {
                    let (first, second) = dst.split_at_mut(half);
                    for (((x0, x1), &c), &s) in first.iter_mut().zip(second).zip(cos).zip(sin) {
                        rotate(x0, x1, c, s);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::kernels::test_values as values;
    use candle_core::{Device, Tensor};

    #[test]
    fn rms_norm_matches_candle_s() {
        let (rows, width) = (5, 576);
        let x = values(rows * width, 3, 4.0);
        let w = values(width, 4, 2.0);
        let mut ours = Vec::new();
        rms_norm(&x, &w, 1e-5, &mut ours);
        let dev = Device::Cpu;
        let theirs: Vec<f32> = candle_nn::ops::rms_norm(
            &Tensor::from_vec(x.clone(), (rows, width), &dev).unwrap(),
            &Tensor::from_vec(w, width, &dev).unwrap(),
            1e-5,
        )
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
        for (a, b) in ours.iter().zip(&theirs) {
            assert!((a - b).abs() <= 1e-5 * b.abs().max(1.0), "{a} vs {b}");
        }
        // A row alone gets the bits it gets among others.
        let mut alone = Vec::new();
        rms_norm(
            &x[2 * width..3 * width],
            &values(width, 4, 2.0),
            1e-5,
            &mut alone,
        );
        assert_eq!(alone, ours[2 * width..3 * width]);
    }

    #[test]
    fn gathered_heads_match_candle_s_rope_both_ways_and_its_norm() {
        let (rows, heads, hd) = (3, 4, 8);
        let stride = heads * hd + 5;
        let x = values(rows * stride, 7, 2.0);
        let positions = [4u32, 0, 9];
        let table = |seed| values(10 * hd / 2, seed, 2.0);
        let (cos, sin) = (table(8), table(9));
        let norm_weight = values(hd, 10, 2.0);
        let dev = Device::Cpu;
        let xs = Tensor::from_vec(x.clone(), (rows, stride), &dev).unwrap();
        let heads_t = xs
            .narrow(1, 5, heads * hd)
            .unwrap()
            .reshape((1, rows, heads, hd))
            .unwrap()
            .transpose(1, 2)
            .unwrap()
            .contiguous()
            .unwrap();
        let normed_t = candle_nn::ops::rms_norm(
            &heads_t,
            &Tensor::new(norm_weight.as_slice(), &dev).unwrap(),
            1e-6,
        )
        .unwrap();
        let pick = |t: Vec<f32>| {
            let t = Tensor::from_vec(t, (10, hd / 2), &dev).unwrap();
            let ids = Tensor::new(&positions, &dev).unwrap();
            t.index_select(&ids, 0).unwrap().contiguous().unwrap()
        };
        let (cos_t, sin_t) = (pick(cos.clone()), pick(sin.clone()));
        let flat = |t: Tensor| -> Vec<f32> { t.flatten_all().unwrap().to_vec1().unwrap() };
        for pairs in [RopePairs::Adjacent, RopePairs::Halves] {
            let rotary = Rotary {
                positions: &positions,
                cos: &cos,
                sin: &sin,
                pairs,
            };
            let rope = |t: &Tensor| match pairs {
                RopePairs::Adjacent => candle_nn::rotary_emb::rope_i(t, &cos_t, &sin_t).unwrap(),
                RopePairs::Halves => candle_nn::rotary_emb::rope(t, &cos_t, &sin_t).unwrap(),
            };
            let mut ours = Vec::new();
            gather_heads(&x, stride, 5, heads, hd, None, Some(rotary), &mut ours);
            assert_eq!(ours, flat(rope(&heads_t)), "{pairs:?}");
            gather_heads(
                &x,
                stride,
                5,
                heads,
                hd,
                Some((&norm_weight, 1e-6)),
                Some(rotary),
                &mut ours,
            );
            let theirs = flat(rope(&normed_t));
            let worst = ours
                .iter()
                .zip(&theirs)
                .map(|(a, b)| (a - b).abs())
                .fold(0f32, f32::max);
            assert!(worst < 1e-5, "{pairs:?} with the head norm: {worst}");
        }
        let mut plain = Vec::new();
        gather_heads(&x, stride, 5, heads, hd, None, None, &mut plain);
        assert_eq!(plain, flat(heads_t));
    }

    #[test]
    fn a_bias_is_added_to_every_row() {
        let mut x = vec![1.0, 2.0, 3.0, 4.0, 5.0, 6.0];
        add_bias(&mut x, &[10.0, 20.0, 30.0]);
        assert_eq!(x, [11.0, 22.0, 33.0, 14.0, 25.0, 36.0]);
    }
}
