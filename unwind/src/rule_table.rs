//! The rules of unwind rows, numbered: the rows refer to them by a 16-bit index. Rules repeat
//! a lot (rsp+8, rsp+16, … rbp+16), so a few thousand serve every library on a machine.

use std::collections::HashMap;

use crate::rule::UnwindRule;

/// Rules shared by all tables, indexed by u16.
#[derive(Debug, Default, Clone)]
pub struct RuleTable {
    rules: Vec<UnwindRule>,
    index: HashMap<UnwindRule, u16>,
}

impl RuleTable {
    pub const CAPACITY: usize = 1 << 16;

    /// The index of `rule`, added if new; None when the table is full.
    pub fn intern(&mut self, rule: UnwindRule) -> Option<u16> {
        if let Some(&i) = self.index.get(&rule) {
            return Some(i);
        }
        if self.rules.len() >= Self::CAPACITY {
            return None;
        }
        let i = self.rules.len() as u16;
        self.rules.push(rule);
        self.index.insert(rule, i);
        Some(i)
    }

    pub fn get(&self, i: u16) -> Option<UnwindRule> {
        self.rules.get(usize::from(i)).copied()
    }

    pub fn len(&self) -> usize {
        self.rules.len()
    }

    pub fn is_empty(&self) -> bool {
        self.rules.is_empty()
    }

    /// Rules added since `start`, with their indices, for loading into BPF.
    pub fn since(&self, start: usize) -> impl Iterator<Item = (u16, UnwindRule)> + '_ {
        self.rules.iter().enumerate().skip(start).map(|(i, r)| (i as u16, *r))
    }
}

