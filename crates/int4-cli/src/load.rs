//! What every command that loads a model shares: the flags that say how (`--path`, `--priority`, `--group`,
//! `--head-bits`, `--kv`) and the load options they make, with a progress bar for a first packing. Its own module
//! so that each command's module (`bench`, and the ones in `main`) reads it without importing the others.

use clap::builder::TypedValueParser;
use int4::kernels::w4a8::ActivationScales;
use int4::layout::GroupSize;
use int4::select::policy::Priority;
use int4::{HeadBits, KvType, LoadOptions, PackProgress, RunPath};

/// `--path`: one of [`RunPath::ALL`]'s names, listed in `--help`.
pub(crate) fn path_parser() -> impl clap::builder::TypedValueParser<Value = RunPath> {
    clap::builder::PossibleValuesParser::new(RunPath::ALL.map(RunPath::name))
        .map(|name| name.parse::<RunPath>().expect("every listed name parses"))
}

/// `--act-scales`: W4A8's int8 activation scales, one per weight group or one per token.
#[derive(Clone, Copy, clap::ValueEnum)]
pub(crate) enum ActScalesArg {
    PerGroup,
    PerToken,
}

impl ActScalesArg {
    /// The granularity this flag names.
    pub(crate) fn scales(self) -> ActivationScales {
        match self {
            ActScalesArg::PerGroup => ActivationScales::PerGroup,
            ActScalesArg::PerToken => ActivationScales::PerToken,
        }
    }
}

/// How an unquantized checkpoint is quantized at load (a quantized one keeps its own grid): the options
/// every command that loads or describes a model shares.
#[derive(clap::Args)]
pub(crate) struct QuantArgs {
    /// Input channels per scale and zero when quantizing at load: 32, 64, 128 or 256 (default: the
    /// runtime's, which docs/quantize.md measures). With speed priority the grid also decides whether
    /// `--path auto` takes W4A8 (docs/policy.md).
    #[arg(long, alias = "group-size")]
    pub(crate) group: Option<i64>,
    /// Bits for a head the checkpoint stores unquantized: 4, or 8 (llama.cpp's Q8_0 grid, groups of 32; a
    /// tied embedding follows the head). Default: the runtime's.
    #[arg(long)]
    pub(crate) head_bits: Option<u8>,
    /// How the KV cache stores keys and values: f32, or f16 (half the bytes attention reads at long
    /// contexts). Default: f16 with speed priority, f32 with fidelity priority or `--path f32`.
    #[arg(long, value_parser = kv_parser())]
    pub(crate) kv: Option<KvType>,
}

/// `--kv`: one of [`KvType::ALL`]'s names, listed in `--help`.
fn kv_parser() -> impl clap::builder::TypedValueParser<Value = KvType> {
    clap::builder::PossibleValuesParser::new(KvType::ALL.map(KvType::name))
        .map(|name| name.parse::<KvType>().expect("every listed name parses"))
}

impl QuantArgs {
    /// The options these flags set on a load.
    pub(crate) fn apply(&self, opts: &mut LoadOptions) -> Result<(), String> {
        if let Some(g) = self.group {
            opts.group_size = GroupSize::from_checkpoint(g).map_err(|e| format!("--group {g}: {e}"))?;
        }
        if let Some(b) = self.head_bits {
            opts.head_bits = HeadBits::from_bits(b.into()).ok_or_else(|| format!("--head-bits {b}: 4 or 8"))?;
        }
        if self.kv.is_some() {
            opts.kv = self.kv;
        }
        Ok(())
    }
}

/// `--priority`: speed or fidelity.
pub(crate) fn priority(p: &str) -> Result<Priority, Box<dyn std::error::Error>> {
    match p {
        "speed" => Ok(Priority::Speed),
        "fidelity" => Ok(Priority::Fidelity),
        other => Err(format!("--priority {other}: expected speed or fidelity").into()),
    }
}

/// Load options with a progress bar on stderr for the first (cold) packing of a model's layers; the
/// environment's variables checked (`LoadOptions::from_env`).
pub(crate) fn load_options(
    path: RunPath,
    priority: Priority,
    context: usize,
    no_cache: bool,
) -> Result<LoadOptions, Box<dyn std::error::Error>> {
    let bar = indicatif::ProgressBar::hidden();
    bar.set_style(
        indicatif::ProgressStyle::with_template("[int4] packing layers {bar:30} {pos}/{len} {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    let progress = PackProgress(std::sync::Arc::new(move |done, total| {
        if bar.is_hidden() && done < total {
            bar.set_draw_target(indicatif::ProgressDrawTarget::stderr());
        }
        bar.set_length(total as u64);
        bar.set_position(done as u64);
        if done == total {
            bar.finish_and_clear();
        }
    }));
    let mut opts = LoadOptions { path, priority, context, progress: Some(progress), ..LoadOptions::from_env()? };
    if no_cache {
        opts.cache = None;
    }
    Ok(opts)
}
