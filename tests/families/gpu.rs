//! The families' GPU test (a module of tests/families.rs, whose tiny models and bit
//! checks it runs on the device).

use super::*;

#[path = "../common/mod.rs"]
mod common;

/// On a GPU (the `cuda` feature; tools/gpu-shapes.sh runs this with
/// `SUFFIXD_TEST_DEVICE=cuda`; tools/cuda-on-cpu runs it on the CPU), its own kernels run
/// every family: Llama 3, Mistral (its window binding), Qwen 2 (q|k|v biases), Qwen 3
/// (head norms, heads wider than width / heads) and Gemma 3 (sandwich norms, GELU, scaled
/// embeddings, sliding layers with their own RoPE base; heads of 32 and of 256), from a
/// directory and from GGUF (RoPE on halves). Each one's logits agree with the CPU's pass
/// on the same weights (relative error under 1e-3 in f32: summation orders differ; 5e-3
/// in bf16, where the CPU rounds activations to bf16 and the GPU does not), and a token's
/// logits are the same bits alone, in a chain, in a tree, after a prefix restored from
/// blocks on the device and in a pass of 40 rows.
#[test]
fn on_a_gpu_its_kernels_run_every_family_exactly() {
    assert!(
        std::env::var("SUFFIXD_TEST_DEVICE").is_ok_and(|d| d == "cuda"),
        "this test needs a GPU: run it with SUFFIXD_TEST_DEVICE=cuda"
    );
    let gpu = Device::new_cuda(0).expect("a CUDA GPU");
    for (fam, head_dim) in [
        (Fam::Llama3, None),
        (Fam::Mistral, None),
        (Fam::Qwen2, None),
        (Fam::Qwen3, None),
        (Fam::SmolLM3, None),
        (Fam::Gemma3, None),
        (Fam::Gemma3, Some(256)),
    ] {
        let tiny = Tiny::with_head_dim(fam, head_dim);
        let dir = tempfile::tempdir().unwrap();
        tiny.write_hf(dir.path());
        let gguf = dir.path().join("model.gguf");
        tiny.write_gguf(&gguf, GgmlDType::F32);
        let load = |from_gguf: bool, format: WeightFormat, device: &Device| {
            if from_gguf {
                let mut f = std::fs::File::open(&gguf).unwrap();
                let content = gguf_file::Content::read(&mut f).unwrap();
                Model::load_gguf(&gguf, &content, format, CONTEXT, device).unwrap()
            } else {
                Model::load_safetensors(dir.path(), format, CONTEXT, device).unwrap()
            }
        };
        // Mistral's GGUF is llama's: its window lives in the directory's config.
        let sources: &[bool] = if fam == Fam::Mistral {
            &[false]
        } else {
            &[false, true]
        };
        for &from_gguf in sources {
            for format in [WeightFormat::F32, WeightFormat::Bf16] {
                let what = format!(
                    "{fam:?} (heads of {}) {format:?} from {} on the GPU",
                    tiny.head_dim,
                    if from_gguf { "GGUF" } else { "a directory" }
                );
                let on_gpu = load(from_gguf, format, &gpu);
                let on_cpu = load(from_gguf, format, &Device::Cpu);
                let (dev, cpu) = (
                    ours(&on_gpu, &PROMPT).concat(),
                    ours(&on_cpu, &PROMPT).concat(),
                );
                common::assert_near_the_cpu(&cpu, &dev, format, &what);
                same_bits_alone_in_a_chain_and_in_a_tree(&on_gpu, &what);
                a_long_pass_gives_the_bits_of_decoding(&on_gpu, &what);
            }
        }
    }
}
