//! The model bench's chart: a plain SVG (no plotting crate: three bar panels are a few dozen lines)
//! drawn from the bench's own JSON document, so the chart shows exactly the numbers the table does.
//!
//! Panels, one bar per path: prefill tok/s (the bench's pp length), decode tok/s (tg), and decode GB/s
//! (bytes read per decode step × tg tok/s) against the streaming-read ceiling measured in the same run,
//! drawn as a dashed line.

use std::fmt::Write;

use serde_json::Value;

const BAR_H: f64 = 18.0;
const GAP: f64 = 6.0;
const LABEL_W: f64 = 110.0;
const PLOT_W: f64 = 420.0;
const PANEL_GAP: f64 = 40.0;
const COLOURS: [&str; 6] = ["#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b"];

/// One bar panel: a title, `(label, value, sd)` bars and an optional ceiling line.
struct Panel {
    title: String,
    bars: Vec<(String, f64, f64)>,
    ceiling: Option<(String, f64)>,
}

/// The SVG for a `int4-model-bench/2` document.
pub fn model_svg(doc: &Value) -> String {
    let rows = doc["rows"].as_array().cloned().unwrap_or_default();
    let num = |v: &Value, k: &str| v[k].as_f64().filter(|x| x.is_finite()).unwrap_or(0.0);
    let label = |r: &Value| r["path"].as_str().unwrap_or("?").to_string();
    let pp = rows.first().map_or(0, |r| r["pp"].as_u64().unwrap_or(0));
    let tg = rows.first().map_or(0, |r| r["tg"].as_u64().unwrap_or(0));
    let panels = [
        Panel {
            title: format!("prefill: pp{pp} tok/s"),
            bars: rows.iter().map(|r| (label(r), num(r, "pp_tok_s_mean"), num(r, "pp_tok_s_sd"))).collect(),
            ceiling: None,
        },
        Panel {
            title: format!("decode: tg{tg} tok/s"),
            bars: rows.iter().map(|r| (label(r), num(r, "tg_tok_s_mean"), num(r, "tg_tok_s_sd"))).collect(),
            ceiling: None,
        },
        Panel {
            title: "decode GB/s (bytes read per step × tok/s)".into(),
            bars: rows.iter().map(|r| (label(r), num(r, "decode_gbs"), 0.0)).collect(),
            ceiling: Some(("streaming read".into(), num(doc, "stream_read_gbs_mean"))),
        },
    ];
    let panel_h = |p: &Panel| 28.0 + p.bars.len() as f64 * (BAR_H + GAP) + 20.0;
    let width = LABEL_W + PLOT_W + 120.0;
    let height = 40.0 + panels.iter().map(|p| panel_h(p) + PANEL_GAP).sum::<f64>();
    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="100%" height="100%" fill="white"/>"#);
    let title = format!(
        "{} — {} threads{}",
        doc["model_name"].as_str().unwrap_or("model"),
        doc["threads"].as_u64().unwrap_or(0),
        doc["synthetic"].as_str().map_or(String::new(), |k| format!(" (synthetic {k})"))
    );
    let _ = writeln!(s, r#"<text x="10" y="22" font-size="15" font-weight="bold">{}</text>"#, escape(&title));
    let mut y = 40.0;
    for panel in &panels {
        let max = panel
            .bars
            .iter()
            .map(|b| b.1 + b.2)
            .chain(panel.ceiling.as_ref().map(|c| c.1))
            .fold(0.0_f64, f64::max)
            .max(1e-9);
        let scale = PLOT_W / (max * 1.1);
        let _ = writeln!(s, r#"<text x="10" y="{}" font-weight="bold">{}</text>"#, y + 14.0, escape(&panel.title));
        let top = y + 24.0;
        for (i, (name, value, sd)) in panel.bars.iter().enumerate() {
            let by = top + i as f64 * (BAR_H + GAP);
            let w = value * scale;
            let colour = COLOURS[i % COLOURS.len()];
            let _ = writeln!(
                s,
                r#"<text x="{}" y="{}" text-anchor="end">{}</text>"#,
                LABEL_W - 6.0,
                by + 13.0,
                escape(name)
            );
            let _ = writeln!(s, r#"<rect x="{LABEL_W}" y="{by}" width="{w:.1}" height="{BAR_H}" fill="{colour}"/>"#);
            if *sd > 0.0 {
                let (x0, x1) = (LABEL_W + (value - sd).max(0.0) * scale, LABEL_W + (value + sd) * scale);
                let cy = by + BAR_H / 2.0;
                let _ = writeln!(s, r#"<line x1="{x0:.1}" y1="{cy}" x2="{x1:.1}" y2="{cy}" stroke="black"/>"#);
            }
            let _ = writeln!(
                s,
                r#"<text x="{:.1}" y="{}">{value:.1}</text>"#,
                LABEL_W + (value + sd) * scale + 4.0,
                by + 13.0
            );
        }
        let bottom = top + panel.bars.len() as f64 * (BAR_H + GAP);
        let _ = writeln!(s, r#"<line x1="{LABEL_W}" y1="{top}" x2="{LABEL_W}" y2="{bottom}" stroke="black"/>"#);
        if let Some((name, c)) = &panel.ceiling {
            let x = LABEL_W + c * scale;
            let _ = writeln!(
                s,
                r#"<line x1="{x:.1}" y1="{}" x2="{x:.1}" y2="{bottom}" stroke="black" stroke-dasharray="4 3"/>"#,
                top - 4.0
            );
            let _ = writeln!(s, r#"<text x="{:.1}" y="{}">{} {c:.1}</text>"#, x + 4.0, bottom + 12.0, escape(name));
        }
        y += panel_h(panel) + PANEL_GAP;
    }
    s.push_str("</svg>\n");
    s
}

fn escape(t: &str) -> String {
    t.replace('&', "&amp;").replace('<', "&lt;").replace('>', "&gt;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_chart_draws_every_path_and_the_ceiling() {
        let doc = serde_json::json!({
            "model_name": "m<1>", "threads": 2, "stream_read_gbs_mean": 30.0,
            "rows": [
                {"path": "w4a16", "pp": 512, "tg": 128, "pp_tok_s_mean": 600.0, "pp_tok_s_sd": 5.0,
                 "tg_tok_s_mean": 170.0, "tg_tok_s_sd": 2.0, "decode_gbs": 12.5},
                {"path": "bf16", "pp": 512, "tg": 128, "pp_tok_s_mean": 550.0, "pp_tok_s_sd": 0.0,
                 "tg_tok_s_mean": f64::NAN, "tg_tok_s_sd": 0.0, "decode_gbs": 20.0},
            ],
        });
        let svg = model_svg(&doc);
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect").count(), 1 + 3 * 2, "a background and one bar per path per panel");
        assert!(svg.contains("pp512 tok/s") && svg.contains("tg128 tok/s"));
        assert!(svg.contains("streaming read 30.0"));
        assert!(svg.contains("m&lt;1&gt;"), "text is escaped");
        assert!(!svg.contains("NaN"), "a missing figure draws as zero");
    }
}
