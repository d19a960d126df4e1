//! The loss curve beside `train.jsonl`.

use std::path::Path;

use plotters::prelude::*;

use crate::error::{Error, Result};
use crate::run::LogLine;

/// Writes an SVG of training loss (and validation loss where evaluated) against step.
pub fn loss_curve(lines: &[LogLine], path: &Path) -> Result<()> {
    let err = |e: String| Error::Config(format!("plot {}: {e}", path.display()));
    let train: Vec<(f64, f64)> = lines.iter().map(|l| (l.step as f64, l.loss)).collect();
    let val: Vec<(f64, f64)> = lines
        .iter()
        .filter_map(|l| l.eval.map(|e| (l.step as f64, e.loss)))
        .collect();
    let max_x = train.iter().map(|p| p.0).fold(1.0, f64::max);
    let max_y = train.iter().chain(&val).map(|p| p.1).fold(0.1, f64::max) * 1.05;
    let root = SVGBackend::new(path, (800, 480)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(e.to_string()))?;
    let mut chart = ChartBuilder::on(&root)
        .caption("memagent LoRA training", ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(36)
        .y_label_area_size(48)
        .build_cartesian_2d(0f64..max_x, 0f64..max_y)
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_mesh()
        .x_desc("update")
        .y_desc("loss (nats per target token)")
        .draw()
        .map_err(|e| err(e.to_string()))?;
    chart
        .draw_series(LineSeries::new(train, &BLUE))
        .map_err(|e| err(e.to_string()))?
        .label("train")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], BLUE));
    chart
        .draw_series(LineSeries::new(val.clone(), &RED))
        .map_err(|e| err(e.to_string()))?
        .label("validation")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 16, y)], RED));
    chart
        .draw_series(val.into_iter().map(|p| Circle::new(p, 3, RED.filled())))
        .map_err(|e| err(e.to_string()))?;
    chart
        .configure_series_labels()
        .background_style(WHITE)
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(e.to_string()))?;
    root.present().map_err(|e| err(e.to_string()))?;
    Ok(())
}
