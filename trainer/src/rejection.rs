//! Rejection-sampling fine-tuning (expert iteration): the CPU-sized form of learning from
//! answers. For each training document the current model reads it several times with
//! sampling, each memory step its own conversation as at inference; every trajectory is
//! scored by the reward of its outcome (question mode: the final answer holds every
//! planted value; general mode: the share of planted facts the final memory keeps), the
//! best one that earned the reward is kept, and its conversations become training
//! examples ([`SampledExamples`]). Train on them, sample again with the new adapter,
//! repeat.
//!
//! The reward and the selection are separate functions of a group of scored trajectories,
//! so a policy-gradient loss (GRPO: every trajectory weighted by its reward's advantage
//! within the group) can take the same groups later.

use std::collections::HashSet;
use std::io::{BufRead, BufReader};
use std::path::Path;

use memagent_agent::{
    Backend, Chunk, MemoryAgent, Profile, StepReport, TextTokenizer, Writer, GENERAL_UPDATE,
    NO_MEMORY, UPDATE,
};
use memagent_engine::SamplingParams;
use memagent_tasks::training::{Mode, Split, Trajectory, NO_FACTS};
use serde::{Deserialize, Serialize};

use crate::data::TaskData;
use crate::error::{io, Error, Result};
use crate::run::{Examples, Sequence};

/// How trajectories are sampled and which are kept.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct SampleConfig {
    /// Trajectories sampled per document (the group).
    pub samples: usize,
    pub temperature: f32,
    pub top_p: f32,
    /// Seed of the sampling; the same seed draws the same trajectories.
    pub seed: u64,
    /// How general-mode memories are written (as `memctl ingest --writer`).
    pub writer: Writer,
    /// Least reward a kept trajectory has: 1 keeps only answers holding every value and
    /// memories keeping every planted fact.
    pub min_reward: f64,
    /// General mode with the line writer: train on the best reading corrected where it
    /// fell short ([`corrected`]) rather than only on readings that earned `min_reward`.
    #[serde(default)]
    pub correct: bool,
}

impl Default for SampleConfig {
    fn default() -> Self {
        Self {
            samples: 4,
            temperature: 0.7,
            top_p: 0.95,
            seed: 1,
            writer: Writer::Lines,
            min_reward: 1.0,
            correct: false,
        }
    }
}

/// What one trajectory earned.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Reward {
    /// Question mode: 1 when the final answer holds every expected value, else 0.
    /// General mode: the share of planted facts whose values the final memory holds.
    pub score: f64,
    /// Memory lines that hold no current fact whole (general mode; 0 in question mode):
    /// small talk, stale values, invented or half facts. Fewer wins a tie.
    pub noise_lines: usize,
}

/// The reward of a trajectory that ended with `memory` and, in question mode, `answer`:
/// the scores `scripts/eval-validation` gives.
pub fn reward(t: &Trajectory, memory: &str, answer: &str) -> Reward {
    match t.mode {
        Mode::Question => {
            let answer = answer.to_lowercase();
            let right = t
                .expected
                .iter()
                .all(|e| answer.contains(&e.to_lowercase()));
            Reward {
                score: if right { 1.0 } else { 0.0 },
                noise_lines: 0,
            }
        }
        Mode::General => {
            let kept = t.fact_values.iter().filter(|vs| holds(memory, vs)).count();
            let noise_lines = memory
                .lines()
                .filter(|l| !l.trim().is_empty())
                .filter(|l| !t.fact_values.iter().any(|vs| holds(l, vs)))
                .count();
            Reward {
                score: kept as f64 / t.fact_values.len().max(1) as f64,
                noise_lines,
            }
        }
    }
}

/// Whether `text` holds every one of `values`, ignoring case.
fn holds(text: &str, values: &[String]) -> bool {
    let text = text.to_lowercase();
    values.iter().all(|v| text.contains(&v.to_lowercase()))
}

/// The trajectory of a group to train on: the highest score, then the fewest noise lines,
/// then the first drawn; none when even the best scored under `min_reward` or nothing.
pub fn select(rewards: &[Reward], min_reward: f64) -> Option<usize> {
    let mut best: Option<usize> = None;
    for (i, r) in rewards.iter().enumerate() {
        let better = match best {
            None => true,
            Some(b) => {
                let b = rewards[b];
                r.score > b.score || (r.score == b.score && r.noise_lines < b.noise_lines)
            }
        };
        if better {
            best = Some(i);
        }
    }
    best.filter(|&b| rewards[b].score >= min_reward && rewards[b].score > 0.0)
}

/// One conversation of a sampled trajectory, as the model had it and replied.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Conversation {
    /// `update` or `final`.
    pub kind: String,
    pub message: String,
    pub target: String,
    /// The memory an update step started from.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory_before: Option<String>,
}

/// One sampled reading of a document.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Sampled {
    pub reward: Reward,
    pub memory: String,
    /// The final answer (question mode).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub answer: String,
    pub conversations: Vec<Conversation>,
    /// The memory after each step, as the reading wrote it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub memories: Vec<String>,
}

/// How one sampled reading ended.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Outcome {
    #[serde(flatten)]
    pub reward: Reward,
    pub memory: String,
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub answer: String,
}

/// A document's group: how every sample ended and the kept reading's conversations (one
/// line of a samples file).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Group {
    /// The trajectory's index in the training split.
    pub index: u64,
    pub family: String,
    pub mode: Mode,
    pub samples: Vec<Outcome>,
    pub selected: Option<usize>,
    /// Whether the selected reading was corrected before its conversations were kept.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub corrected: bool,
    /// The selected reading's conversations (none when nothing was selected).
    pub conversations: Vec<Conversation>,
}

impl Group {
    /// The group of `t` from its samples, the best kept.
    /// With `correct` (general mode, line writer), the best reading is kept whatever its
    /// reward, corrected where it fell short.
    pub fn of(
        index: u64,
        t: &Trajectory,
        samples: Vec<Sampled>,
        min_reward: f64,
        correct: bool,
    ) -> Group {
        let rewards: Vec<Reward> = samples.iter().map(|s| s.reward).collect();
        let correct = correct && t.mode == Mode::General;
        // Corrected, even a reading that kept nothing teaches (it becomes the oracle's).
        let selected = if correct {
            select(&rewards, 0.0).or((!samples.is_empty()).then_some(0))
        } else {
            select(&rewards, min_reward)
        };
        let conversations = match selected {
            None => Vec::new(),
            Some(i) if correct => {
                let fixed = corrected(t, &samples[i].memories);
                conversations(t, &fixed, "", Writer::Lines, &HashSet::new())
            }
            Some(i) => samples[i].conversations.clone(),
        };
        Group {
            index,
            family: t.family.to_string(),
            mode: t.mode,
            corrected: correct && selected.is_some(),
            samples: samples
                .into_iter()
                .map(|s| Outcome {
                    reward: s.reward,
                    memory: s.memory,
                    answer: s.answer,
                })
                .collect(),
            selected,
            conversations,
        }
    }
}

/// The seed of sample `sample`'s step `round` (the final answer is the round after the
/// last step): every sequence of a batch step gets it, so a document's trajectory is the
/// same whatever documents share its batches.
fn step_seed(seed: u64, sample: usize, round: usize) -> u64 {
    let mut z = seed
        .wrapping_add((sample as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15))
        .wrapping_add((round as u64 + 1).wrapping_mul(0xD1B5_4A32_D192_ED03));
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// Reads each of `trajectories` once, as sample number `sample`, with the model behind
/// `backend`: the trajectory's own chunks, one step each (decoded as one batch across the
/// documents), then the final answer in question mode. Each memory step is the one
/// inference takes: the MemAgent update in question mode, the general writer in general
/// mode.
pub fn sample_once(
    backend: &dyn Backend,
    tokenizer: &dyn TextTokenizer,
    profile: Profile,
    trajectories: &[Trajectory],
    sample: usize,
    config: &SampleConfig,
) -> Result<Vec<Sampled>> {
    let agent_for = |round: usize| {
        let mut agent = MemoryAgent::new(backend, tokenizer, profile);
        agent.sampling = SamplingParams {
            temperature: config.temperature,
            top_p: config.top_p,
            seed: step_seed(config.seed, sample, round),
        };
        agent
    };
    let chunks = chunks_of(trajectories, tokenizer)?;
    let mut memories = vec![NO_MEMORY.to_string(); trajectories.len()];
    let mut reports: Vec<Vec<StepReport>> = vec![Vec::new(); trajectories.len()];
    let rounds = chunks.iter().map(Vec::len).max().unwrap_or(0);
    for round in 0..rounds {
        let agent = agent_for(round);
        let done = step_round(
            &agent,
            trajectories,
            &chunks,
            &memories,
            round,
            config.writer,
        )?;
        for (i, step) in done {
            memories[i].clone_from(&step.memory);
            reports[i].push(step);
        }
    }
    let question: Vec<usize> = (0..trajectories.len())
        .filter(|&i| trajectories[i].mode == Mode::Question)
        .collect();
    let mut answers = vec![String::new(); trajectories.len()];
    if !question.is_empty() {
        let items: Vec<(&str, &str)> = question
            .iter()
            .map(|&i| (trajectories[i].question.as_str(), memories[i].as_str()))
            .collect();
        let replies = agent_for(rounds).answer_many(None, &items)?;
        for (&i, reply) in question.iter().zip(replies) {
            answers[i] = reply.reply;
        }
    }
    Ok(trajectories
        .iter()
        .zip(reports)
        .zip(memories.into_iter().zip(answers))
        .map(|((t, steps), (memory, answer))| {
            let compacted: HashSet<usize> = steps
                .iter()
                .enumerate()
                .filter(|(_, s)| {
                    s.repaired
                        .as_deref()
                        .is_some_and(|r| r.contains("compacted"))
                })
                .map(|(i, _)| i)
                .collect();
            let memories: Vec<String> = steps.iter().map(|s| s.memory.clone()).collect();
            Sampled {
                reward: reward(t, &memory, &answer),
                conversations: conversations(
                    t,
                    &as_read(t, &memories),
                    &answer,
                    config.writer,
                    &compacted,
                ),
                memories,
                memory,
                answer,
            }
        })
        .collect())
}

/// Each trajectory's chunks, counted in the model's tokens.
fn chunks_of(
    trajectories: &[Trajectory],
    tokenizer: &dyn TextTokenizer,
) -> Result<Vec<Vec<Chunk>>> {
    let chunks: Vec<Vec<Chunk>> = trajectories
        .iter()
        .map(|t| {
            t.steps
                .iter()
                .map(|s| {
                    Ok(Chunk {
                        tokens: tokenizer.encode(&s.chunk)?.len(),
                        text: s.chunk.clone(),
                    })
                })
                .collect::<Result<Vec<_>>>()
        })
        .collect::<Result<_>>()?;
    Ok(chunks)
}

/// Step `round` of every trajectory that has one, decoded as one batch per mode: the
/// MemAgent update in question mode, `writer` in general mode. Each step with its
/// trajectory's index.
fn step_round(
    agent: &MemoryAgent<'_>,
    trajectories: &[Trajectory],
    chunks: &[Vec<Chunk>],
    memories: &[String],
    round: usize,
    writer: Writer,
) -> Result<Vec<(usize, StepReport)>> {
    let active: Vec<usize> = (0..trajectories.len())
        .filter(|&i| round < chunks[i].len())
        .collect();
    let (question, general): (Vec<usize>, Vec<usize>) = active
        .into_iter()
        .partition(|&i| trajectories[i].mode == Mode::Question);
    let mut done: Vec<(usize, StepReport)> = Vec::new();
    if !question.is_empty() {
        let inputs: Vec<(&str, &str, &Chunk)> = question
            .iter()
            .map(|&i| {
                (
                    trajectories[i].question.as_str(),
                    memories[i].as_str(),
                    &chunks[i][round],
                )
            })
            .collect();
        done.extend(
            question
                .iter()
                .copied()
                .zip(agent.update_many(UPDATE, &inputs)?),
        );
    }
    if !general.is_empty() {
        let stepped = match writer {
            Writer::Lines => {
                let inputs: Vec<(&str, &Chunk)> = general
                    .iter()
                    .map(|&i| (memories[i].as_str(), &chunks[i][round]))
                    .collect();
                agent.update_lines_many(&inputs, None)?
            }
            Writer::Rewrite => {
                let inputs: Vec<(&str, &str, &Chunk)> = general
                    .iter()
                    .map(|&i| ("", memories[i].as_str(), &chunks[i][round]))
                    .collect();
                agent.update_many(GENERAL_UPDATE, &inputs)?
            }
        };
        done.extend(general.iter().copied().zip(stepped));
    }
    Ok(done)
}

/// `t` with the memories a reading wrote in place of the oracle's.
fn as_read(t: &Trajectory, memories: &[String]) -> Trajectory {
    let mut read = t.clone();
    let mut before = NO_MEMORY.to_string();
    for (step, memory) in read.steps.iter_mut().zip(memories) {
        step.memory_before = std::mem::replace(&mut before, memory.clone());
        step.memory_after.clone_from(memory);
    }
    read
}

/// Words of a line, as written (letters, digits, inner apostrophes), a trailing "'s"
/// dropped.
fn words_of(text: &str) -> Vec<&str> {
    text.split(|c: char| !(c.is_alphanumeric() || c == '\''))
        .map(|w| w.trim_matches('\''))
        .map(|w| w.strip_suffix("'s").unwrap_or(w))
        .filter(|w| !w.is_empty())
        .collect()
}

/// Whether a model's memory line states the planted fact `oracle` (whose values are
/// `values`): it holds every value, at least half the oracle line's other words that carry
/// meaning ("lives", "allergic", "sister"), and no capitalised word that `source` (the
/// chunk, the memory and the oracle's lines) lacks — a name it misspelled or invented.
fn states(line: &str, oracle: &str, values: &[String], source: &HashSet<&str>) -> bool {
    const GLUE: &[&str] = &[
        "the", "a", "an", "is", "are", "as", "to", "in", "of", "for", "and", "user",
    ];
    if !holds(line, values) {
        return false;
    }
    let value_words: HashSet<String> = values
        .iter()
        .flat_map(|v| {
            words_of(v)
                .into_iter()
                .map(str::to_lowercase)
                .collect::<Vec<_>>()
        })
        .collect();
    let mine: HashSet<String> = words_of(line).into_iter().map(str::to_lowercase).collect();
    let meaning: Vec<String> = words_of(oracle)
        .into_iter()
        .map(str::to_lowercase)
        .filter(|w| !GLUE.contains(&w.as_str()) && !value_words.contains(w))
        .collect();
    let shared = meaning.iter().filter(|w| mine.contains(*w)).count();
    let invented = words_of(line)
        .into_iter()
        .any(|w| w.starts_with(char::is_uppercase) && !source.contains(w));
    2 * shared >= meaning.len() && !invented
}

/// A general-mode line-writer reading corrected where it fell short, for training on
/// states the model itself reaches (as DAgger does): each step keeps the lines the
/// model wrote that state a planted fact ([`states`]), drops its other lines (small
/// talk, invented, misspelt or half facts), and adds the oracle's line for each fact the
/// chunk states that neither the memory nor the kept lines hold. The corrected memory
/// is carried to the next step, merged as inference merges. A reading that kept every
/// fact and wrote no noise is its own correction.
pub fn corrected(t: &Trajectory, memories: &[String]) -> Trajectory {
    use memagent_agent::lines::{memory_lines, merge, render};
    // The values of an oracle line: those of the final fact it is, if it is one.
    let values_of = |line: &str| -> Option<&[String]> {
        t.memory_lines
            .iter()
            .position(|l| l == line)
            .map(|k| t.fact_values[k].as_slice())
    };
    let mut fixed = t.clone();
    let mut kept: Vec<String> = Vec::new();
    let mut read_before: Vec<String> = Vec::new();
    for (i, step) in fixed.steps.iter_mut().enumerate() {
        let read: Vec<String> = memories.get(i).map(|m| memory_lines(m)).unwrap_or_default();
        let mut source: HashSet<&str> = words_of(&step.chunk).into_iter().collect();
        source.extend(t.steps[..=i].iter().flat_map(|s| words_of(&s.memory_after)));
        let planted = |line: &str| {
            t.memory_lines
                .iter()
                .zip(&t.fact_values)
                .any(|(oracle, values)| states(line, oracle, values, &source))
        };
        let mut new: Vec<String> = read
            .iter()
            .filter(|l| !read_before.contains(l) && planted(l))
            .cloned()
            .collect();
        read_before = read;
        let oracle_before: Vec<&str> = step.memory_before.lines().collect();
        for line in step.memory_after.lines() {
            if line.trim().is_empty() || line == NO_FACTS || oracle_before.contains(&line) {
                continue;
            }
            let held = match values_of(line) {
                Some(values) => kept.iter().chain(&new).any(|l| holds(l, values)),
                // A fact a later one replaced: held when written as the oracle words it.
                None => kept.iter().chain(&new).any(|l| l == line),
            };
            if !held {
                new.push(line.to_string());
            }
        }
        let before = if kept.is_empty() {
            NO_MEMORY.to_string()
        } else {
            render(&kept)
        };
        let (after, _) = merge(&before, &new, None).expect("a merge without an embedder");
        kept = memory_lines(&after);
        step.memory_before = before;
        step.memory_after = if kept.is_empty() {
            NO_MEMORY.to_string()
        } else {
            after
        };
    }
    fixed
}

/// The conversations a sampled reading had, with the model's replies as targets: the
/// trajectory's examples with its memories in place of the oracle's. Line-writer steps
/// that compacted the memory are left out (their new memory is a rewrite, not the reply
/// of the line template), and so is general mode's final answer, which no sample wrote.
fn conversations(
    t: &Trajectory,
    read: &Trajectory,
    answer: &str,
    writer: Writer,
    compacted: &HashSet<usize>,
) -> Vec<Conversation> {
    let mut read = read.clone();
    read.answer = answer.to_string();
    let lines = t.mode == Mode::General && writer == Writer::Lines;
    read.examples(writer)
        .into_iter()
        .enumerate()
        .filter(|(i, e)| {
            let final_answer = e.kind == "final";
            let unwritten = final_answer && t.mode == Mode::General;
            !(unwritten || lines && compacted.contains(i))
        })
        .map(|(_, e)| Conversation {
            kind: e.kind.to_string(),
            message: e.message,
            target: e.target,
            memory_before: e.memory_before,
        })
        .collect()
}

/// The groups of a samples file, one JSON line each.
pub fn read_groups(path: &Path) -> Result<Vec<Group>> {
    let file = std::fs::File::open(path).map_err(io(path))?;
    let mut groups = Vec::new();
    for (n, line) in BufReader::new(file).lines().enumerate() {
        let line = line.map_err(io(path))?;
        if line.trim().is_empty() {
            continue;
        }
        let group: Group = serde_json::from_str(&line).map_err(|e| {
            Error::Config(format!(
                "{}:{}: not a sampled group ({e}); write samples files with memctl train sample",
                path.display(),
                n + 1
            ))
        })?;
        groups.push(group);
    }
    Ok(groups)
}

/// Training examples from samples files: each training index draws a kept conversation
/// (with replacement, from the data seed) with probability `share`, else the generator's
/// example of that index (with the data's own `general_share`); validation stays the
/// generator's, so that the teacher-forced scores of runs compare. A kept conversation is
/// a general-mode one with `general_share` of probability, else a question-mode one,
/// whatever share of the kept
/// conversations each mode has: question documents have more steps, and a round that
/// takes every kept conversation alike drifts toward question mode.
pub struct SampledExamples {
    pub data: TaskData,
    pub general: Vec<Conversation>,
    pub question: Vec<Conversation>,
    pub share: f64,
    /// Probability that a kept conversation drawn is a general-mode one.
    pub general_share: f64,
}

impl SampledExamples {
    /// The kept conversations of `files`; an error when none of them kept any.
    pub fn open(data: TaskData, files: &[&Path], share: f64, general_share: f64) -> Result<Self> {
        let (mut general, mut question) = (Vec::new(), Vec::new());
        for file in files {
            for group in read_groups(file)? {
                match group.mode {
                    Mode::General => general.extend(group.conversations),
                    Mode::Question => question.extend(group.conversations),
                }
            }
        }
        if general.is_empty() && question.is_empty() {
            return Err(Error::Config(format!(
                "no kept trajectory in {}; sample more documents or lower --min-reward",
                files
                    .iter()
                    .map(|f| f.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )));
        }
        Ok(Self {
            data,
            general,
            question,
            share,
            general_share,
        })
    }

    /// Kept conversations in all.
    pub fn len(&self) -> usize {
        self.general.len() + self.question.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Unit-interval draws of training index `index`, and a word for the pick.
    fn draw(&self, index: u64) -> (f64, f64, u64) {
        let unit = |z: u64| (z >> 11) as f64 / (1u64 << 53) as f64;
        let a = step_seed(self.data.config.seed ^ 0x05A3_D1E5, index as usize, 0);
        let b = step_seed(a, 1, 1);
        let c = step_seed(b, 2, 2);
        (unit(a), unit(b), c)
    }
}

impl Examples for SampledExamples {
    fn sequence(&self, split: Split, index: u64) -> Result<Sequence> {
        let (u, mode, pick) = self.draw(index);
        if split == Split::Validation || u >= self.share {
            return self.data.sequence(split, index);
        }
        let general =
            !self.general.is_empty() && (self.question.is_empty() || mode < self.general_share);
        let list = if general {
            &self.general
        } else {
            &self.question
        };
        let c = &list[(pick % list.len() as u64) as usize];
        self.data
            .tokenize(&c.message, &c.target, c.memory_before.as_deref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use memagent_tasks::training::Step;

    fn trajectory(mode: Mode) -> Trajectory {
        Trajectory {
            mode,
            family: "chat",
            filler: "none".into(),
            question: "Where does Ada live?".into(),
            steps: vec![Step {
                chunk: "Ada lives in Graz. Ben was born on 3 May.".into(),
                memory_before: "No previous memory".into(),
                memory_after: "Ada lives in Graz.".into(),
                relevant: vec![],
                distractors: vec![],
                values: vec![],
            }],
            answer: "\\boxed{Graz}".into(),
            expected: vec!["Graz".into()],
            memory_lines: vec!["Ada lives in Graz.".into(), "Ben was born on 3 May.".into()],
            fact_values: vec![
                vec!["Ada".into(), "Graz".into()],
                vec!["Ben".into(), "3 May".into()],
            ],
        }
    }

    #[test]
    fn general_reward_is_the_share_of_facts_kept_and_counts_noise() {
        let t = trajectory(Mode::General);
        let r = reward(&t, "Ada lives in graz.\nThe weather was nice.\nBen.", "");
        assert_eq!(r.score, 0.5);
        assert_eq!(r.noise_lines, 2);
        let all = reward(&t, "Ada lives in Graz.\nBen's birthday: 3 May.", "");
        assert_eq!((all.score, all.noise_lines), (1.0, 0));
    }

    #[test]
    fn question_reward_needs_every_expected_value() {
        let mut t = trajectory(Mode::Question);
        assert_eq!(reward(&t, "", "\\boxed{graz}").score, 1.0);
        assert_eq!(reward(&t, "", "\\boxed{Vienna}").score, 0.0);
        t.expected.push("Linz".into());
        assert_eq!(reward(&t, "", "Graz").score, 0.0);
    }

    #[test]
    fn selection_takes_the_best_then_the_cleanest_then_the_first() {
        let r = |score, noise_lines| Reward { score, noise_lines };
        assert_eq!(
            select(&[r(0.5, 0), r(1.0, 2), r(1.0, 1), r(1.0, 1)], 1.0),
            Some(2)
        );
        assert_eq!(select(&[r(0.5, 0), r(0.75, 3)], 1.0), None);
        assert_eq!(select(&[r(0.5, 0), r(0.75, 3)], 0.5), Some(1));
        assert_eq!(select(&[r(0.0, 0), r(0.0, 0)], 0.0), None, "nothing earned");
        assert_eq!(select(&[], 0.0), None);
    }

    /// Two steps: Ada's home in the first chunk, Ben's birthday in the second.
    fn two_steps() -> Trajectory {
        let mut t = trajectory(Mode::General);
        t.steps = vec![
            Step {
                chunk: "user: Ada lives in Graz.\nuser: Nice weather.".into(),
                memory_before: "No previous memory".into(),
                memory_after: "Ada lives in Graz.".into(),
                relevant: vec![],
                distractors: vec![],
                values: vec![],
            },
            Step {
                chunk: "user: Ben was born on 3 May.".into(),
                memory_before: "Ada lives in Graz.".into(),
                memory_after: "Ada lives in Graz.\nBen was born on 3 May.".into(),
                relevant: vec![],
                distractors: vec![],
                values: vec![],
            },
        ];
        t
    }

    #[test]
    fn a_reading_is_corrected_where_it_fell_short() {
        let t = two_steps();
        // The model wrote Ada's home its own way beside small talk, then missed Ben.
        let read = [
            "Ada lives in Graz now.\nThe weather was nice.".to_string(),
            "Ada lives in Graz now.\nThe weather was nice.".to_string(),
        ];
        let fixed = corrected(&t, &read);
        let memories: Vec<(&str, &str)> = fixed
            .steps
            .iter()
            .map(|s| (s.memory_before.as_str(), s.memory_after.as_str()))
            .collect();
        assert_eq!(
            memories,
            [
                ("No previous memory", "Ada lives in Graz now."),
                (
                    "Ada lives in Graz now.",
                    "Ada lives in Graz now.\nBen was born on 3 May."
                ),
            ]
        );
        let targets: Vec<String> = conversations(&t, &fixed, "", Writer::Lines, &HashSet::new())
            .into_iter()
            .map(|c| c.target)
            .collect();
        assert_eq!(
            targets,
            ["Ada lives in Graz now.", "Ben was born on 3 May."]
        );
        // A reading that missed nothing and wrote no noise is its own correction.
        let clean = [
            "Ada lives in Graz.".to_string(),
            "Ada lives in Graz.\nBen was born on 3 May this year.".to_string(),
        ];
        let fixed = corrected(&t, &clean);
        assert_eq!(fixed.steps, as_read(&t, &clean).steps);
        // An empty reading becomes the oracle's.
        let empty = [
            "No previous memory".to_string(),
            "No previous memory".to_string(),
        ];
        assert_eq!(corrected(&t, &empty).steps, t.steps);
        // Lines holding the values but not the fact are the oracle's again: another
        // relation, or a name the chunk never gave.
        for wrong in ["Ada's home is Graz.", "Ada's friend Zed lives in Graz."] {
            let read = [wrong.to_string(), wrong.to_string()];
            assert_eq!(corrected(&t, &read).steps, t.steps, "{wrong}");
        }
    }

    #[test]
    fn corrected_groups_keep_the_best_reading_whatever_its_reward() {
        let t = two_steps();
        let sampled = |memories: [&str; 2]| {
            let memories: Vec<String> = memories.iter().map(|m| m.to_string()).collect();
            Sampled {
                reward: reward(&t, &memories[1], ""),
                memory: memories[1].clone(),
                answer: String::new(),
                conversations: Vec::new(),
                memories,
            }
        };
        let samples = vec![
            sampled(["No previous memory", "No previous memory"]),
            sampled(["Ada lives in Graz.", "Ada lives in Graz."]),
        ];
        let plain = Group::of(7, &t, samples.clone(), 1.0, false);
        assert_eq!((plain.selected, plain.corrected), (None, false));
        assert!(plain.conversations.is_empty());
        let targets = |g: &Group| -> Vec<String> {
            g.conversations.iter().map(|c| c.target.clone()).collect()
        };
        let group = Group::of(7, &t, samples.clone(), 1.0, true);
        assert_eq!((group.selected, group.corrected), (Some(1), true));
        assert_eq!(
            targets(&group),
            ["Ada lives in Graz.", "Ben was born on 3 May."]
        );
        // A group that kept nothing at all is taught the oracle's lines.
        let group = Group::of(7, &t, samples[..1].to_vec(), 1.0, true);
        assert_eq!((group.selected, group.corrected), (Some(0), true));
        assert_eq!(
            targets(&group),
            ["Ada lives in Graz.", "Ben was born on 3 May."]
        );
    }

    #[test]
    fn step_seeds_differ_by_sample_and_round() {
        let seeds: HashSet<u64> = (0..4)
            .flat_map(|s| (0..8).map(move |r| step_seed(1, s, r)))
            .collect();
        assert_eq!(seeds.len(), 32);
        assert_eq!(step_seed(1, 2, 3), step_seed(1, 2, 3));
        assert_ne!(step_seed(1, 2, 3), step_seed(2, 2, 3));
    }
}
