//! Profiles between their two forms: [`Profile::flatten`] and [`FlatProfile::expand`].

use super::builder::TableBuilder;
use super::table::{FlatProfile, Samples};
use crate::profile::{Profile, Sample};

impl<S: Samples> Profile<S> {
    /// The sum of the first sample type's values.
    pub fn total(&self) -> i64 {
        (0..self.samples.len()).map(|i| self.samples.value(i)).sum()
    }

    /// This profile with its samples stored flat.
    pub fn flatten(&self) -> FlatProfile {
        let mut table = TableBuilder::new(self.sample_types.len());
        for i in 0..self.samples.len() {
            table.add(self.samples.stack(i).iter(), self.samples.labels(i).clone(), self.samples.values(i));
        }
        let mut flat = self.clone_header();
        (flat.mappings, flat.locations, flat.process_labels) = (self.mappings.clone(), self.locations.clone(), self.process_labels.clone());
        table.finish(&mut flat);
        flat
    }
}

impl FlatProfile {
    /// This profile with a [`Sample`] per sample, as recordings hold them.
    pub fn expand(self) -> Profile {
        let samples = (0..self.samples.len())
            .map(|i| Sample { stack: self.samples.stack(i).iter().collect(), values: self.samples.values(i).to_vec(), labels: self.samples.labels(i).clone() })
            .collect();
        let mut profile: Profile = self.clone_header();
        (profile.mappings, profile.locations, profile.process_labels, profile.samples) = (self.mappings, self.locations, self.process_labels, samples);
        profile
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::frame::FrameKind;
    use crate::profile::{Labels, Location, ProfileBuilder};

    #[test]
    fn flat_and_expanded_profiles_hold_the_same_samples() {
        let mut profile = Profile::cpu(99);
        let mut b = ProfileBuilder::default();
        let (x, y) = (b.location(&mut profile, Location::named("x", FrameKind::Native)), b.location(&mut profile, Location::named("y", FrameKind::Native)));
        let labels = |pid| Labels { pid: Some(pid), comm: Some("c".into()), ..Default::default() };
        b.add(vec![x, y], labels(2), 30);
        b.add(vec![x], labels(1), 10);
        b.add(vec![x, y], labels(1), 20);
        b.finish(&mut profile);
        let flat = profile.flatten();
        assert_eq!(flat.samples.len(), 3);
        assert_eq!(flat.total(), profile.total());
        assert_eq!((flat.samples.stack(0).iter().collect::<Vec<_>>(), flat.samples.value(0)), (vec![x], 10));
        assert_eq!(flat.samples.labels(2).pid, Some(2));
        assert_eq!(flat.expand(), profile);
    }
}
