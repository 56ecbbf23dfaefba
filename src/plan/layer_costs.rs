//! Reading measured per-layer costs for `plan checkpoint --layers`: a JSON array (or JSON
//! Lines) of layers, each with its stored activation bytes, the bytes of its input (what full
//! recompute keeps), its forward cost (FLOPs or milliseconds, any one unit), and optionally
//! what selective recompute would keep and cost.

use super::checkpoint::LayerCost;
use serde::Deserialize;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum LayerCostsError {
    #[error("layer {index}: {reason}")]
    Layer { index: usize, reason: String },
    #[error("not a JSON array or JSON Lines of layer objects: {0}")]
    Json(String),
    #[error("no layers")]
    Empty,
}

/// One layer; other fields (a `name`, say) are ignored.
#[derive(Deserialize)]
struct Record {
    stored_bytes: f64,
    input_bytes: f64,
    forward_cost: f64,
    selective_bytes: Option<f64>,
    selective_cost: Option<f64>,
}

/// Parses the layers; each value must be a finite non-negative number and the input and the
/// selective bytes no more than the stored bytes.
pub fn parse_layer_costs(text: &str) -> Result<Vec<LayerCost>, LayerCostsError> {
    let trimmed = text.trim_start();
    let records: Vec<Record> = if trimmed.starts_with('[') {
        serde_json::from_str(trimmed).map_err(|e| LayerCostsError::Json(e.to_string()))?
    } else {
        trimmed
            .lines()
            .filter(|l| !l.trim().is_empty())
            .enumerate()
            .map(|(index, l)| {
                serde_json::from_str(l).map_err(|e| LayerCostsError::Layer {
                    index,
                    reason: e.to_string(),
                })
            })
            .collect::<Result<_, _>>()?
    };
    if records.is_empty() {
        return Err(LayerCostsError::Empty);
    }
    records
        .into_iter()
        .enumerate()
        .map(|(index, r)| {
            let err = |reason: &str| LayerCostsError::Layer {
                index,
                reason: reason.to_string(),
            };
            let selective = r.selective_bytes.unwrap_or(r.stored_bytes);
            let values = [
                r.stored_bytes,
                r.input_bytes,
                r.forward_cost,
                selective,
                r.selective_cost.unwrap_or(0.0),
            ];
            if values.iter().any(|v| !v.is_finite() || *v < 0.0) {
                return Err(err("sizes and costs must be finite, non-negative numbers"));
            }
            if r.input_bytes > r.stored_bytes || selective > r.stored_bytes {
                return Err(err(
                    "input_bytes and selective_bytes cannot exceed stored_bytes",
                ));
            }
            Ok(LayerCost {
                stored: r.stored_bytes,
                selective,
                input: r.input_bytes,
                selective_flops: r.selective_cost.unwrap_or(0.0),
                full_flops: r.forward_cost,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn array_and_lines() {
        let array = r#"[{"name": "block.0", "stored_bytes": 100, "input_bytes": 5, "forward_cost": 2.5},
            {"stored_bytes": 80, "input_bytes": 4, "forward_cost": 2, "selective_bytes": 30, "selective_cost": 0.1}]"#;
        let layers = parse_layer_costs(array).expect("parses");
        assert_eq!(layers.len(), 2);
        assert_eq!(layers[0].selective, 100.0);
        assert_eq!(layers[1].selective_flops, 0.1);
        let lines = "{\"stored_bytes\": 1, \"input_bytes\": 1, \"forward_cost\": 1}\n\n";
        assert_eq!(parse_layer_costs(lines).expect("parses").len(), 1);
    }

    #[test]
    fn errors_name_the_layer() {
        let bad = r#"[{"stored_bytes": 1, "input_bytes": 2, "forward_cost": 1}]"#;
        assert!(parse_layer_costs(bad)
            .expect_err("bad")
            .to_string()
            .starts_with("layer 0:"));
        let unknown = "{\"stored\": 1}";
        assert!(parse_layer_costs(unknown)
            .expect_err("bad")
            .to_string()
            .starts_with("layer 0:"));
        assert_eq!(parse_layer_costs("[]"), Err(LayerCostsError::Empty));
    }
}
