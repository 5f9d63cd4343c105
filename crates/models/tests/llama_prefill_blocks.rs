//! A prompt is prefilled in blocks of rows: its workspace (attention's partial results are
//! the rows times `max_seq`) is one block's, whatever the prompt's length, and the blocks give
//! the ids of a prefill in one pass.

use cuflow_models::llama::{GenerateOptions, Llama, LlamaConfig};
use cuflow_runtime::DeviceError;
use cuflow_testing::device::device;

/// One layer of eight query heads of width 16 over one key/value head: the shape whose
/// prefill workspace is largest beside its caches.
fn wide_attention() -> LlamaConfig {
    LlamaConfig {
        hidden_size: 64,
        num_hidden_layers: 1,
        num_attention_heads: 8,
        num_key_value_heads: Some(1),
        head_dim: Some(16),
        ..LlamaConfig::tiny()
    }
}

/// Caches of `max_seq` positions that take a sixteenth of the device (64 bytes a position
/// here), and a prompt of 1,000 tokens whose partial attention results over all of them at
/// once (1.125 bytes a row and position) would be larger than the device: the prompt is
/// prefilled, and gives the ids it gives over caches of a few positions (one block).
#[test]
fn a_prompt_whose_one_pass_workspace_exceeds_the_device_is_prefilled() -> Result<(), DeviceError> {
    const PROMPT_LEN: usize = 1000;
    const TOKENS: usize = 4;
    let device = device();
    let total = device.memory_info()?.total;
    if total == 0 {
        return Ok(()); // A memory of unknown size is not checked.
    }
    let cfg = wide_attention();
    let max_seq = (total / 1024).min(u32::MAX as usize / 4);
    let parts = max_seq.div_ceil(512);
    let one_pass = PROMPT_LEN * cfg.num_attention_heads * parts * (16 + 2) * 4;
    assert!(one_pass > total, "{one_pass} bytes fit {total}");

    let model = Llama::synthetic(&device, cfg, 7)?;
    let stream = device.new_stream()?;
    let prompt: Vec<u32> = (0..PROMPT_LEN as u32).map(|i| i * 37 % 256).collect();
    let mut step = model.decoder(&stream, GenerateOptions::greedy().max_seq(max_seq))?;
    let ids = step.generate(&prompt, TOKENS)?;
    drop(step);
    let one_block = model.generate(&stream, &prompt, TOKENS, &GenerateOptions::greedy())?;
    assert_eq!(ids, one_block);
    Ok(())
}

/// The same shape and prompt over caches of 4,096 positions, prefilled in one pass: the
/// decoder gives the ids that `generate` gives. (The kernels of the test above over grids a
/// few thousand times smaller, which the sanitizer's race checker can follow.)
#[test]
fn the_wide_attention_shape_over_small_caches_gives_the_ids_of_generate() -> Result<(), DeviceError>
{
    const PROMPT_LEN: usize = 1000;
    const TOKENS: usize = 4;
    let device = device();
    let model = Llama::synthetic(&device, wide_attention(), 7)?;
    let stream = device.new_stream()?;
    let prompt: Vec<u32> = (0..PROMPT_LEN as u32).map(|i| i * 37 % 256).collect();
    let mut step = model.decoder(&stream, GenerateOptions::greedy().max_seq(4096))?;
    let ids = step.generate(&prompt, TOKENS)?;
    drop(step);
    let eager = model.generate(&stream, &prompt, TOKENS, &GenerateOptions::greedy())?;
    assert_eq!(ids, eager);
    assert_eq!(ids.len(), TOKENS);
    Ok(())
}
