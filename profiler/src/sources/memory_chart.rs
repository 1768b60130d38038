//! The memory timeline's points made into a chart: the sites that held most become bands named
//! by their Python line, the others one band.

use crate::cuda::memory_points::MemoryTimeline;
use crate::output::memory_svg::{Band, ChartOom, ChartPoint, DeviceChart};
use crate::stacks::Stacks;

use super::oom::holder_label;
use crate::frame::NamedFrame;

/// Bands drawn per device, besides the one of all other sites.
pub const BANDS: usize = 8;

pub fn chart(timeline: &mut MemoryTimeline, end_ns: u64, stacks: &mut Stacks) -> Vec<DeviceChart> {
    if timeline.is_empty() {
        return Vec::new();
    }
    timeline.finish(end_ns);
    let first = timeline.first_ns();
    let secs = |t: u64| t.saturating_sub(first) as f64 / 1e9;
    let mut charts = Vec::new();
    for (device, points) in timeline.devices() {
        // The sites with the highest peaks.
        let mut peaks: std::collections::HashMap<u32, u64> = std::collections::HashMap::new();
        for p in points {
            for &(site, bytes) in &p.top {
                let peak = peaks.entry(site).or_default();
                *peak = (*peak).max(bytes);
            }
        }
        let mut ranked: Vec<(u32, u64)> = peaks.into_iter().collect();
        ranked.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        ranked.truncate(BANDS);
        let bands = ranked
            .iter()
            .map(|&(site, peak)| {
                let frames = stacks.frames(&timeline.site(site).stack);
                Band { label: holder_label(&frames), stack: NamedFrame::joined(&frames), peak }
            })
            .collect();
        let points = points
            .iter()
            .map(|p| {
                let mut values: Vec<u64> = ranked.iter().map(|&(site, _)| p.top.iter().find(|t| t.0 == site).map_or(0, |t| t.1)).collect();
                let shown: u64 = values.iter().sum();
                values.push(p.total.saturating_sub(shown));
                ChartPoint { t_s: secs(p.t_ns), total: p.total, values }
            })
            .collect();
        let ooms = timeline.ooms.iter().filter(|o| o.device == device).map(|o| ChartOom { t_s: secs(o.t_ns), requested: o.requested }).collect();
        charts.push(DeviceChart { device, bands, points, ooms });
    }
    charts
}
