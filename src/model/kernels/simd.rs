//! Which instruction set the CPU kernels use, chosen once per process.

/// Which instruction set the kernels use. Chosen once per process: the best this CPU
/// has, unless `SUFFIXD_SIMD` names a lower one (`portable`, `avx2`, `avx512vnni`,
/// `avxvnni`), which is how the paths are compared on one machine.
///
/// Every path computes the same exact integer dot products and the same IEEE float
/// operations in the same order, so all of them give the same bits (tested): a machine
/// with VNNI and one without agree, as a 1-row and a 64-row pass do. (bf16 weights: a
/// partial sum below 1.18 · 10⁻³⁸ is flushed to zero with AVX-512 BF16 and kept
/// without; see `dense::bf16`.)
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(into = "&'static str")]
pub enum Simd {
    /// x86-64 AVX2 and FMA.
    Avx2,
    /// AVX2 and FMA, with the integer dot products by AVX-512 VNNI's 256-bit `vpdpbusd`
    /// (AVX512_VNNI and AVX512VL: Intel Xeon since Ice Lake, AMD since Zen 4).
    Avx512Vnni,
    /// AVX2 and FMA, with the integer dot products by AVX-VNNI's `vpdpbusd` (Intel
    /// since Alder Lake, AMD since Zen 5).
    AvxVnni,
    /// Plain Rust: the same arithmetic, one lane at a time.
    Portable,
}

impl Simd {
    /// What the kernels use: the best this CPU supports, or `SUFFIXD_SIMD`'s choice when
    /// the CPU has it (otherwise the best, with a warning).
    pub fn detect() -> Simd {
        static DETECTED: std::sync::OnceLock<Simd> = std::sync::OnceLock::new();
        *DETECTED.get_or_init(|| {
            let available = Simd::available();
            let Ok(wanted) = std::env::var("SUFFIXD_SIMD") else {
                return available[0];
            };
            match available.iter().find(|s| s.name() == wanted) {
                Some(&chosen) => chosen,
                None => {
                    tracing::warn!(
                        "SUFFIXD_SIMD={wanted} is not available on this CPU (it has {}); using {}",
                        available
                            .iter()
                            .map(|s| s.name())
                            .collect::<Vec<_>>()
                            .join(", "),
                        available[0].name()
                    );
                    available[0]
                }
            }
        })
    }

    /// Every path this CPU can run, best first; the last is always `Portable`.
    pub fn available() -> &'static [Simd] {
        static AVAILABLE: std::sync::OnceLock<Vec<Simd>> = std::sync::OnceLock::new();
        AVAILABLE.get_or_init(Simd::probe)
    }

    /// Whether this CPU can run the path. The kernels refuse one it cannot (a panic, not
    /// an illegal instruction).
    pub fn is_available(self) -> bool {
        Simd::available().contains(&self)
    }

    fn probe() -> Vec<Simd> {
        #[allow(unused_mut)]
        let mut paths = Vec::new();
        #[cfg(target_arch = "x86_64")]
        {
            if std::is_x86_feature_detected!("avx2")
                && std::is_x86_feature_detected!("fma")
                && std::is_x86_feature_detected!("f16c")
            {
                if std::is_x86_feature_detected!("avx512vnni")
                    && std::is_x86_feature_detected!("avx512vl")
                    && std::is_x86_feature_detected!("avx512f")
                {
                    paths.push(Simd::Avx512Vnni);
                }
                if std::is_x86_feature_detected!("avxvnni") {
                    paths.push(Simd::AvxVnni);
                }
                paths.push(Simd::Avx2);
            }
        }
        paths.push(Simd::Portable);
        paths
    }

    /// The name `SUFFIXD_SIMD` takes.
    pub fn name(self) -> &'static str {
        match self {
            Simd::Avx2 => "avx2",
            Simd::Avx512Vnni => "avx512vnni",
            Simd::AvxVnni => "avxvnni",
            Simd::Portable => "portable",
        }
    }

    /// Whether this is an x86 path, all of which have AVX2, FMA and F16C (the quantized
    /// kernels widen f16 scales): the float kernels, which need nothing more, then use
    /// their AVX2 code. Only for an available path.
    pub fn has_avx2_fma(self) -> bool {
        cfg!(target_arch = "x86_64") && self != Simd::Portable
    }

    /// Whether this path has AVX-512F too (the float kernels' wide path). Only for an
    /// available path.
    pub fn has_avx512f(self) -> bool {
        cfg!(target_arch = "x86_64") && self == Simd::Avx512Vnni
    }

    /// Whether this path has AVX-512 BF16 too (`vdpbf16ps`, for bf16 weights: AMD since
    /// Zen 4, Intel Xeon since Sapphire Rapids). Paths without it compute the same sums
    /// with FMAs (see `dense::bf16`).
    pub fn has_avx512bf16(self) -> bool {
        #[cfg(target_arch = "x86_64")]
        return self.has_avx512f() && std::is_x86_feature_detected!("avx512bf16");
        #[cfg(not(target_arch = "x86_64"))]
        false
    }
}

/// Serialized by its [`Simd::name`].
impl From<Simd> for &'static str {
    fn from(simd: Simd) -> Self {
        simd.name()
    }
}
