//! How a question is answered from a memory and the passages found for it: each passage
//! asked on its own, then one answer chosen, with the passages it cites.

use std::collections::HashMap;

use chrono::NaiveDateTime;
use memagent_agent::{AnswerReport, MemoryAgent, TextTokenizer, PASSAGE_ANSWER};
use memagent_engine::words::{sentences, stems};
use memagent_recall::dates;
use memagent_recall::passages::{
    answer_context, answering_line, bearing_sentences, coverage, holds_any, is_turn, names,
    rarest_words, relevant_notes, times_once, turn_speaker, turn_time, written_coverage,
};
use memagent_store::MemoryVersion;

use crate::search::{
    asks_for_a_guess, evidence_passages, same_word, unlabelled, unmentioned, Evidence, NOTE_LINES,
};
use crate::Result;

/// One question's answer from [`answer_with_evidence`].
#[derive(Debug, Clone)]
pub struct Answered {
    pub report: AnswerReport,
    /// The passages asked, oldest first, each with what it alone answered and whether
    /// the answer cites it.
    pub passages: Vec<Evidence>,
    /// Prompts the model answered for it (0: answered without the model).
    pub calls: usize,
}

/// How many times the passages of other questions a question asking for every value
/// ([`asks_for_all`]) searches (`k`) and reads (the evidence budget): its values lie in
/// more passages than one answer's does. Measured on LoCoMo's development conversations
/// (docs/benchmarks/conversations/), every multi-hop question (161): F1 0.172 → 0.200
/// reading twice the tokens (24 answers better, 1 worse; searching 16 passages too
/// changed no answer, the budget bound), → 0.223 searching and reading three times as
/// much (23 better than at twice, 1 worse); the evidence among the turns read 37% → 43%
/// → 48%, for 10.6 → 19.4 → 29.1 model calls a multi-hop question. That score takes each
/// gold value's best-matching part of the answer, so extra parts cost nothing there: the
/// whole answer's token F1 (words without stems) went 0.082 → 0.079 → 0.076 and the
/// share of its parts that match a gold value stayed 11%, with 6.5 → 10.1 → 13.9 parts
/// an answer: more values found, as many wrong ones in proportion. Reading more
/// passages for every question (1,024 or 1,536 tokens) answered single values worse
/// (0.411, 0.400 against 0.418 every 4th question).
pub(crate) const LIST_SCALE: usize = 3;

/// How many times the passages of other questions a question asking when
/// ([`asks_when`]) searches: its answer is the date of the turn that bears on it most
/// ([`best_passage`], [`passage_date`]), read by code from every passage found, so no
/// model reads them and no token budget binds. Measured on LoCoMo's development
/// conversations (docs/benchmarks/conversations/), every temporal question (154): the
/// date chosen from the passages that fit the 768 tokens (about three of eight), F1
/// 0.508, evidence among the turns read 72%; from every passage of the eight found
/// 0.535, 79%; of 16, 0.544, 82%; of 24, 0.542, 84%; model calls 3.0 → 0.6 a question
/// (the rest write their date out, and the model reads those). With the later search
/// (late interaction) and dates: of 16, F1 0.567 and 85.7%; of 24, 0.567 and 86.0%; of
/// 40, 0.567 and 86.7% (one answer changed, wrong either way), 0.21 → 0.23 s a question.
pub(crate) const WHEN_SCALE: usize = 5;

/// Each question answered from its passages, one prompt per passage
/// ([`PASSAGE_ANSWER`]), and from the memory's notes that bear on it, all decoded as one
/// batch. A question asking for every value ("What pets does Ana have?") reads
/// [`LIST_SCALE`] times `budget` of passages and gets the answers of every passage that
/// says, oldest first; any other question gets one passage's answer: the newest when it
/// asks how things stand now (a fact said again later replaces what was said before),
/// else the one the search ranked first ([`chosen_answer`]), then the notes', then "not
/// mentioned"; an answer that only repeats a turn's time or label ("2024-03-11 09:40",
/// "user (Ana): …") counts as the passage not telling, as does one that is itself a
/// question ([`told`]). A question asking when gets the
/// date of the turn that bears on it most among every passage found, without the model,
/// when that turn's date is known (see [`WHEN_SCALE`]). A question that names someone or something that neither the passages
/// found nor the memory mention is answered "not mentioned" without the model (see
/// [`unmentioned`]), with no passage; so is a question about one speaker of a chat whose
/// turns bearing on it are another's (see [`said_by_another`]), with its passages;
/// neither rule answers a question asking for a guess ([`asks_for_a_guess`]). Each
/// answer comes with the passages asked, oldest first, each with what it alone answered
/// and whether the answer cites it.
pub fn answer_with_evidence(
    agent: &MemoryAgent<'_>,
    memory: &MemoryVersion,
    questions: &[String],
    found: Vec<Vec<Evidence>>,
    budget: usize,
) -> Result<Vec<Answered>> {
    let mut asked: Vec<Asked> = Vec::with_capacity(found.len());
    for (question, hits) in questions.iter().zip(found) {
        let absent = unmentioned(question, &hits, &memory.text);
        let when = (absent.is_none() && asks_when(question)).then(|| hits.clone());
        // A list reads more passages, each a sentence at a time; other questions read
        // each passage whole.
        let all = asks_for_all(question);
        let budget = match all {
            true => budget * LIST_SCALE,
            false => budget,
        };
        // Each passage's place in the search's order (ranked again, with a rerank): the
        // passages asked are put in log order.
        let places: Vec<(u64, u64)> = hits
            .iter()
            .map(|e| (e.hit.stream_id, e.hit.start))
            .collect();
        let passages = match absent {
            Some(_) => Vec::new(),
            None => evidence_passages(agent.tokenizer(), question, hits, budget)?,
        };
        let found: Vec<usize> = passages
            .iter()
            .map(|(_, e)| {
                let at = (e.hit.stream_id, e.hit.start);
                places.iter().position(|p| *p == at).unwrap_or(usize::MAX)
            })
            .collect();
        let texts: Vec<&str> = passages.iter().map(|(_, e)| e.hit.text.as_str()).collect();
        let made = match absent {
            Some(name) => Some(format!("Not mentioned: nothing stored names {name}.")),
            None => said_by_another(question, &texts).map(|(asked, speaker)| {
                format!("Not mentioned of {asked}: the turns about this are {speaker}'s.")
            }),
        };
        if let (None, Some(hits)) = (&made, when) {
            if let Some(dated) = dated_by_code(agent.tokenizer(), question, hits)? {
                asked.push(dated);
                continue;
            }
        }
        let notes = made
            .is_none()
            .then(|| relevant_notes(&memory.text, question, NOTE_LINES))
            .flatten();
        let mut units = Vec::new();
        for (i, (text, _)) in passages.iter().enumerate().filter(|_| made.is_none()) {
            match all {
                true => units.extend(
                    bearing_sentences(text, question)
                        .into_iter()
                        .map(|s| (i, s.to_string())),
                ),
                false => units.push((i, text.clone())),
            }
        }
        asked.push(Asked {
            made,
            found,
            passages: passages.into_iter().map(|(_, e)| e).collect(),
            units,
            notes,
        });
    }
    // The reader learned a sitting's time once, on its first turn; the passages were
    // chosen as if every turn showed it (more passages in the budget read worse).
    let shown: Vec<Vec<String>> = asked
        .iter()
        .map(|a| a.units.iter().map(|(_, t)| times_once(t)).collect())
        .collect();
    let mut prompts: Vec<(&str, &str, &str)> = Vec::new();
    for ((question, a), shown) in questions.iter().zip(&asked).zip(&shown) {
        for text in shown {
            prompts.push((question, "", text));
        }
        if let Some(notes) = &a.notes {
            prompts.push((question, "", notes));
        }
    }
    let mut replies = read(agent, &prompts)?.into_iter();
    let mut calls = 0;
    let mut out = Vec::with_capacity(asked.len());
    for (question, a) in questions.iter().zip(asked) {
        if let Some(made) = a.made {
            out.push(Answered {
                report: made_answer(made),
                passages: a.passages,
                calls: 0,
            });
            continue;
        }
        let mut report = made_answer(String::new());
        let mut said = |(reply, took): (AnswerReport, usize)| {
            calls += took;
            // A repeat's reply was read for the prompt before it.
            if took > 0 {
                report.prompt_tokens += reply.prompt_tokens;
                report.completion_tokens += reply.completion_tokens;
            }
            report.seconds = reply.seconds;
            report.timings = reply.timings;
            report.stop_reason = reply.stop_reason;
            told(question, &reply.answer)
        };
        let units: Vec<Option<String>> = a
            .units
            .iter()
            .map(|(_, text)| {
                let reply = replies.next().expect("one reply per passage");
                tracing::debug!("{question:?} from {text:?}: {:?}", reply.0.answer);
                // A time or a label repeated says nothing of the question (a turn's
                // date answers "when", which reads it so).
                said(reply).filter(|s| asks_when(question) || !frames_a_turn(s, text))
            })
            .collect();
        let from_notes = a
            .notes
            .and_then(|_| said(replies.next().expect("one reply for the notes")));
        // Every prompt answered once, and those asked again of the base model.
        let calls = std::mem::take(&mut calls);
        let unit_said: Vec<Option<&str>> = units.iter().map(Option::as_deref).collect();
        let texts: Vec<&str> = a.units.iter().map(|(_, t)| t.as_str()).collect();
        let about = about_the_question(question, &texts, &unit_said);
        // When each passage's bearing turn was said, read once a passage from the whole
        // of it: the sentences asked may have lost the time of the turn they come from.
        let passage_said_at: Vec<Option<NaiveDateTime>> = a
            .passages
            .iter()
            .map(|e| said_at(&e.hit.text, question, continued(e)))
            .collect();
        let said_at: Vec<Option<NaiveDateTime>> =
            a.units.iter().map(|(i, _)| passage_said_at[*i]).collect();
        let beside: Vec<Beside> = texts
            .iter()
            .zip(&unit_said)
            .map(|(text, s)| Beside::of(text, s.unwrap_or(""), question))
            .collect();
        let found: Vec<usize> = a.units.iter().map(|(i, _)| a.found[*i]).collect();
        let (answer, cited) = chosen_answer(
            question, &unit_said, &about, &beside, &said_at, &found, from_notes,
        );
        let mut passages = a.passages;
        for ((passage, _), unit) in a.units.iter().zip(&units) {
            if let Some(unit) = unit {
                let said = passages[*passage].said.get_or_insert_with(String::new);
                if !said.is_empty() {
                    said.push(' ');
                }
                said.push_str(unit);
            }
        }
        for unit in cited {
            let passage = &mut passages[a.units[unit].0];
            passage.cited = true;
            // The turn the unit's answer reads from, the first a passage's units cite.
            if let (None, Some(said)) = (&passage.turn, &units[unit]) {
                passage.turn = answering_line(&passage.hit.text, said, question)
                    .map(|(at, end)| passage.turn_at(at, end));
            }
        }
        report.reply = answer.clone();
        report.answer = answer;
        out.push(Answered {
            report,
            passages,
            calls,
        });
    }
    Ok(out)
}

/// The model's answer to each of `prompts` (question, notes, passage). With a reader
/// (an adapter trained on chats of named people), passages of such chats are read with
/// it and the rest (a user's chat with an assistant, plain text, the memory's notes) with
/// the base model, on which the generated checks were measured; a reader's answer with a
/// word its passage does not hold misread it ("Coal" for "cobalt79"), and the base model
/// is asked instead. Each distinct prompt is read once: passages that overlap can show a
/// question the same sentence twice, and a reply does not depend on the prompts beside
/// it in the batch, so a repeat gets the first one's reply. Each reply comes with the
/// model calls it took: none for a repeat, two when asked again of the base model.
fn read(
    agent: &MemoryAgent<'_>,
    prompts: &[(&str, &str, &str)],
) -> Result<Vec<(AnswerReport, usize)>> {
    let mut distinct: Vec<(&str, &str, &str)> = Vec::new();
    let mut first: HashMap<(&str, &str, &str), usize> = HashMap::new();
    let of: Vec<(usize, bool)> = prompts
        .iter()
        .map(|p| match first.get(p) {
            Some(&i) => (i, false),
            None => {
                first.insert(*p, distinct.len());
                distinct.push(*p);
                (distinct.len() - 1, true)
            }
        })
        .collect();
    let (replies, again) = read_distinct(agent, &distinct)?;
    Ok(of
        .into_iter()
        .map(|(i, new)| {
            let calls = usize::from(new) * (1 + usize::from(again[i]));
            (replies[i].clone(), calls)
        })
        .collect())
}

/// [`read`] for prompts that are all distinct; each reply comes with whether it was
/// asked again.
fn read_distinct(
    agent: &MemoryAgent<'_>,
    prompts: &[(&str, &str, &str)],
) -> Result<(Vec<AnswerReport>, Vec<bool>)> {
    if !agent.reads_with_reader(PASSAGE_ANSWER) {
        let replies = agent
            .answer_filled(PASSAGE_ANSWER, prompts)
            .map_err(crate::Error::from)?;
        return Ok((replies, vec![false; prompts.len()]));
    }
    let named = |text: &str| text.lines().any(|line| turn_speaker(line).is_some());
    let (to_reader, to_base): (Vec<usize>, Vec<usize>) =
        (0..prompts.len()).partition(|&i| named(prompts[i].2));
    let pick =
        |idx: &[usize]| -> Vec<(&str, &str, &str)> { idx.iter().map(|&i| prompts[i]).collect() };
    let mut out: Vec<Option<AnswerReport>> = (0..prompts.len()).map(|_| None).collect();
    let read = match to_reader.is_empty() {
        true => Vec::new(),
        false => agent
            .answer_filled(PASSAGE_ANSWER, &pick(&to_reader))
            .map_err(crate::Error::from)?,
    };
    let mut base_ones = to_base;
    for (i, reply) in to_reader.into_iter().zip(read) {
        let answer = first_line(&reply.answer);
        if abstains(&answer) || copied(&answer, prompts[i].2) {
            out[i] = Some(reply);
        } else {
            tracing::debug!("{:?} misread as {:?}", prompts[i].0, reply.answer);
            base_ones.push(i);
        }
    }
    let by_base = match base_ones.is_empty() {
        true => Vec::new(),
        false => agent
            .answer_filled_by_base(PASSAGE_ANSWER, &pick(&base_ones))
            .map_err(crate::Error::from)?,
    };
    let mut again = vec![false; prompts.len()];
    for (i, reply) in base_ones.into_iter().zip(by_base) {
        again[i] = out[i].is_none() && named(prompts[i].2);
        out[i] = Some(reply);
    }
    let replies = out
        .into_iter()
        .map(|r| r.expect("one reply per prompt"))
        .collect();
    Ok((replies, again))
}

/// Whether `answer` is only what frames a turn of `passage` rather than anything said in
/// it: a turn's time ("2024-03-11 09:40", or its clock "09:40") or a turn line copied
/// with its label ("user (Ana): …").
fn frames_a_turn(answer: &str, passage: &str) -> bool {
    let a = answer.trim().trim_end_matches('.').trim_end();
    if a.is_empty() {
        return false;
    }
    is_turn(a)
        || passage
            .split(['\n', '…'])
            .filter_map(|line| turn_time(line.trim_start()))
            .any(|time| {
                time == a
                    || time.strip_suffix(a).is_some_and(|d| d.ends_with(' '))
                    || time.strip_prefix(a).is_some_and(|c| c.starts_with(' '))
            })
}

/// Whether every word of `answer` is one of `passage`'s, as written or nearly
/// ([`same_word`]: a longer word's first six letters, or one letter's slip).
fn copied(answer: &str, passage: &str) -> bool {
    let words = |text: &str| -> Vec<String> {
        text.split(|c: char| !c.is_alphanumeric())
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    let held = words(passage);
    words(answer)
        .iter()
        .all(|w| held.iter().any(|h| same_word(w, h)))
}

/// What stands beside a passage's answer ([`answer_context`]): how many of the
/// question's words, and whether every name the question asks about (none: false).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Beside {
    words: usize,
    named: bool,
}

impl Beside {
    fn of(text: &str, answer: &str, question: &str) -> Self {
        let Some(context) = answer_context(text, answer) else {
            return Self::default();
        };
        let wanted = names(question);
        let held = stems(&context);
        Self {
            words: coverage(&context, question),
            named: !wanted.is_empty()
                && wanted
                    .iter()
                    .all(|n| stems(n).iter().all(|k| held.contains(k))),
        }
    }
}

/// The answer to `question` from what each passage said (in the log's order, stream by
/// stream; `None`: it did not say) and what the notes said, with the passages it cites:
/// every distinct value when the question asks for all of them (between commas, in
/// that order). Else one value: a question asking how things stand now ([`asks_of_now`]:
/// "Where does Ravi live?") gets the newest passage's: the last in the log, unless
/// another was said later by the times the passages show (`said_at`, see [`said_at`];
/// both must show one), then the latest said. A fact said again later replaces what was
/// said before; the log orders one stream, the times order several ("Ravi moved to
/// Krakow" in a chat of August against "Ravi lives in Graz" in notes of March imported
/// after it). Any other question ("What did Ravi bake?") asks of something said once,
/// and gets the answer of the passage the search ranked first (`found`: each passage's
/// place in the search's order), not of a later one that answers another occasion. The notes' answer
/// when no passage says; else "not known".
///
/// Measured on LoCoMo's development conversations (docs/benchmarks/conversations/), the
/// 528 questions answered with one value from the passages: the newest for every
/// question 0.258, the one found first for every question 0.278 (but `bench sessions`'
/// changed facts 100% → 38%), the newest for questions of now and the one found first
/// for the rest 0.273 (24 answers better, 12 worse; the 391 outside every 4th question
/// 0.234 → 0.250).
fn chosen_answer(
    question: &str,
    said: &[Option<&str>],
    about: &[bool],
    beside: &[Beside],
    said_at: &[Option<NaiveDateTime>],
    found: &[usize],
    from_notes: Option<String>,
) -> (String, Vec<usize>) {
    let answering = said
        .iter()
        .enumerate()
        .filter(|&(i, _)| about[i])
        .filter_map(|(i, s)| s.map(|s| (i, s)));
    let cited: Vec<(usize, &str)> = if asks_for_all(question) {
        let mut kept: Vec<(usize, &str)> = Vec::new();
        for (i, s) in answering {
            if !kept.iter().any(|(_, k)| k.eq_ignore_ascii_case(s)) {
                kept.push((i, s));
            }
        }
        kept
    } else {
        // Of single answers, those standing beside the most of the question's words or
        // one fewer, and those beside every name it asks about: a change is often said
        // in other words ("I moved to Krakow!" for where I live, "Ravi moved to Krakow"
        // for where my sister Ravi lives).
        let answering: Vec<(usize, &str)> = answering.collect();
        let most = answering
            .iter()
            .map(|&(i, _)| beside[i].words)
            .max()
            .unwrap_or(0);
        let answering: Vec<(usize, &str)> = answering
            .into_iter()
            .filter(|&(i, _)| {
                let b = beside[i];
                b.words + 1 >= most || (b.named && b.words > 0)
            })
            .collect();
        let first = answering
            .iter()
            .copied()
            .min_by_key(|&(i, _)| (found.get(i).copied().unwrap_or(usize::MAX), i));
        let at = |i: usize| said_at.get(i).copied().flatten();
        let newest = answering.last().copied();
        // Another passage replaces the last in the log only by showing a later time: a
        // passage without one (a chat stamping only a session's first turn) keeps its
        // place.
        let later = newest.and_then(|(n, _)| {
            let after = at(n)?;
            answering
                .iter()
                .copied()
                .filter(|&(i, _)| at(i).is_some_and(|t| t > after))
                .max_by_key(|&(i, _)| (at(i), i))
        });
        match asks_of_now(question) {
            true => later.or(newest).into_iter().collect(),
            false => first.into_iter().collect(),
        }
    };
    if cited.is_empty() {
        let answer =
            from_notes.unwrap_or_else(|| "Not mentioned in the passages found.".to_string());
        return (answer, Vec::new());
    }
    // A list reads as one: its values without their closing stops, between commas.
    let answer = match cited.as_slice() {
        [(_, one)] => one.to_string(),
        many => many
            .iter()
            .map(|(_, s)| s.trim_end_matches('.'))
            .collect::<Vec<_>>()
            .join(", "),
    };
    (answer, cited.into_iter().map(|(i, _)| i).collect())
}

/// Which of the `texts` that answered (`said`) speak of what `question` asks about; the
/// small model answers from a passage about something else as readily as from the
/// right one ("The access code for the cellar is 7368886" from the north gate's).
/// - One missing two or more of the question's words, where another answering text
///   holds them, speaks of something else ("the access code for the boathouse" for "the
///   access code for the north gate"); one missing a single word may say the same thing
///   in other words ("Ravi moved to Porto" for "where does my sister Ravi live").
///   Words are compared as written ([`written_coverage`]): by stems, "lives" would
///   count for "live" and the move would miss two words to the old statement's none
///   (changed facts in `bench sessions`: 100% as written, 50% by stems).
/// - When the question names no one (names are already required of every passage, see
///   [`evidence_passages`]), a text must hold one of its words that the
///   fewest texts hold: "cellar", not "access" and "code", which all four codes share.
fn about_the_question(question: &str, texts: &[&str], said: &[Option<&str>]) -> Vec<bool> {
    let answering: Vec<usize> = (0..texts.len()).filter(|&i| said[i].is_some()).collect();
    let coverage: Vec<usize> = texts
        .iter()
        .map(|t| written_coverage(t, question))
        .collect();
    let best = answering.iter().map(|&i| coverage[i]).max().unwrap_or(0);
    let rare = match names(question).is_empty() {
        true => rarest_words(texts, question),
        false => Vec::new(),
    };
    (0..texts.len())
        .map(|i| coverage[i] + 1 >= best && (rare.is_empty() || holds_any(texts[i], &rare)))
        .collect()
}

/// When `question` asks about one of the people speaking in the chat turns of `texts`,
/// and the turns sharing the most of its other words are statements of someone else,
/// the pair (who is asked about, who said it): the question takes what one person said
/// of themselves for another's ("What did Ravi realise after his half marathon?"
/// where Ana ran it). Each sentence of a turn counts for the one it is about: a
/// question ("How did your race go?") and a sentence about "you" without "I" ("That
/// race sounds great, I'm proud of you" aside) for the one addressed, the other
/// speaker of a two-person chat; the rest for the speaker. Names of speakers are not
/// counted as shared words: every turn is addressed to one. One word more is enough:
/// asking for two more, on LoCoMo's development conversations
/// (docs/benchmarks/conversations/), lowered false "not known" on answerable questions
/// from 7% to 2% but the adversarial questions answered "not mentioned" from 71% to 54%,
/// and the questions let through were answered no better (F1 0.332 → 0.334).
fn said_by_another(question: &str, texts: &[&str]) -> Option<(String, String)> {
    if asks_for_a_guess(question) {
        return None;
    }
    let turns: Vec<(&str, &str)> = texts
        .iter()
        .flat_map(|t| t.lines().filter_map(turn_speaker))
        .collect();
    let mut speakers: Vec<&str> = turns.iter().map(|(s, _)| *s).collect();
    speakers.sort_unstable();
    speakers.dedup();
    let is_speaker = |word: &str| {
        let word = word.to_lowercase();
        speakers
            .iter()
            .any(|s| same_word(&s.to_lowercase(), word.trim_end_matches("'s")))
    };
    let named = names(question);
    let asked: Vec<&str> = speakers
        .iter()
        .copied()
        .filter(|s| {
            let s = s.to_lowercase();
            named.iter().any(|n| same_word(&n.to_lowercase(), &s))
        })
        .collect();
    let [asked] = asked.as_slice() else {
        return None;
    };
    let rest = question
        .split(|c: char| !c.is_alphanumeric() && c != '\'')
        .filter(|w| !w.is_empty() && !is_speaker(w))
        .collect::<Vec<_>>()
        .join(" ");
    let mut theirs = 0;
    let mut others: (usize, &str) = (0, "");
    for (speaker, body) in &turns {
        let addressed = match speakers.as_slice() {
            [a, b] => Some(if a == speaker { *b } else { *a }),
            _ => None,
        };
        // Each person's sentences of the turn, joined.
        let mut about: Vec<(&str, String)> = Vec::new();
        for sentence in sentences(body) {
            let whose = match addresses(sentence) {
                true => match addressed {
                    Some(them) => them,
                    None => continue,
                },
                false => *speaker,
            };
            match about.iter_mut().find(|(who, _)| *who == whose) {
                Some((_, text)) => {
                    text.push(' ');
                    text.push_str(sentence);
                }
                None => about.push((whose, sentence.to_string())),
            }
        }
        for (whose, text) in about {
            let shared = coverage(&text, &rest);
            if whose == *asked {
                theirs = theirs.max(shared);
            } else if shared > others.0 {
                others = (shared, whose);
            }
        }
    }
    (others.0 > theirs).then(|| (asked.to_string(), others.1.to_string()))
}

/// Whether a chat sentence is about the one it is addressed to: a question, or a
/// statement about "you" that says nothing of "I".
fn addresses(sentence: &str) -> bool {
    let words: Vec<String> = sentence
        .split(|c: char| !c.is_alphanumeric() && c != '\'' && c != '\u{2019}')
        .map(|w| w.to_lowercase().replace('\u{2019}', "'"))
        .collect();
    let has = |list: &[&str]| words.iter().any(|w| list.contains(&w.as_str()));
    let you = has(&[
        "you", "your", "yours", "you're", "you've", "you'll", "you'd",
    ]);
    let me = has(&["i", "me", "my", "mine", "i'm", "i've", "i'll", "i'd"]);
    sentence.trim_end().ends_with('?') || (you && !me)
}

/// What one question needs of the batch.
struct Asked {
    /// The answer when it is made without the model.
    made: Option<String>,
    /// Each passage's place among those the search found (0: the first).
    found: Vec<usize>,
    passages: Vec<Evidence>,
    /// What is asked: each passage's text (its sentences one by one for every value),
    /// with the passage's index.
    units: Vec<(usize, String)>,
    notes: Option<String>,
}

/// The first line of an answer with text, without a passage label a small model copies
/// ("Passage 2: …", "Passage: …").
fn first_line(answer: &str) -> String {
    let answer = unlabelled(answer);
    let line = answer
        .lines()
        .map(str::trim)
        .find(|l| !l.is_empty())
        .unwrap_or_default();
    line.strip_prefix("Passage:")
        .map_or(line, str::trim_start)
        .to_string()
}

/// Forms of "be", "do", "have" and "get" that turn a question into the start of its
/// answer ("did … get promoted" → "got promoted").
const RESTATING: &[&str] = &[
    "is", "are", "was", "were", "be", "been", "being", "am", "do", "does", "did", "has", "have",
    "had", "get", "gets", "got", "getting",
];

/// `answer` without the words it opens with that repeat `question` ("What does Ana say
/// running has been great for?" → "Ana says running has been great for her mental
/// health" → "her mental health"): an answer is the name, date or phrase asked for.
/// Each leading word whose stem the question holds, or that is a form of "be", "do",
/// "have" or "get", is cut; the answer stays whole when nothing would be left.
pub fn without_restatement(question: &str, answer: &str) -> String {
    let asked = stems(question);
    let repeats = |word: &str| {
        let bare = word
            .trim_matches(|c: char| !c.is_alphanumeric())
            .to_lowercase();
        RESTATING.contains(&bare.as_str()) || stems(word).iter().all(|s| asked.contains(s))
    };
    let rest = answer
        .split_whitespace()
        .skip_while(|w| repeats(w))
        .collect::<Vec<_>>()
        .join(" ");
    // As written: a code or a name keeps its case ("pinecone42", not "Pinecone42").
    match rest.is_empty() {
        true => answer.to_string(),
        false => rest,
    }
}

/// Whether an answer says the passage (or the stream) does not tell.
pub fn abstains(answer: &str) -> bool {
    let a = answer.trim().to_lowercase();
    a.is_empty()
        || [
            "not known",
            "unknown",
            "not say",
            "no information",
            "not mention",
            "not specif",
            "don't know",
            "do not know",
        ]
        .iter()
        .any(|m| a.contains(m))
}

/// What a model's `reply` to `question` tells: its first line without the words that
/// repeat the question ([`without_restatement`]); nothing when it says the passage does
/// not tell ([`abstains`]) or is itself a question, the question copied back ("Did Ana
/// and Ben grow up with a dog?") or a turn's question copied from the passage ("What
/// kind of cake is it?"), so that another passage's answer is chosen.
fn told(question: &str, reply: &str) -> Option<String> {
    Some(first_line(reply))
        .filter(|s| !abstains(s) && !s.trim_end().ends_with('?'))
        .map(|s| without_restatement(question, &s))
}

/// Whether a question asks how things stand now: the first verb among its first four
/// words is a present-tense auxiliary ("Where does Ravi live?", "What is Ana's job?",
/// "In which city does Ben live?"), not a past one ("What did Ana bake?", "Where was
/// Ben born?"), nor is there none ("Who moved to Porto?").
pub(crate) fn asks_of_now(question: &str) -> bool {
    let words = question
        .split(|c: char| !c.is_alphanumeric() && c != '\'' && c != '\u{2019}')
        .filter(|w| !w.is_empty())
        .take(4)
        .map(|w| w.to_lowercase().replace('\u{2019}', "'"));
    for word in words {
        // "What's", "Where's": "is" (not "Ana's").
        let verb = match word.split_once('\'') {
            Some(("what" | "where" | "who" | "how" | "which", "s")) => "is",
            _ => word.as_str(),
        };
        match verb {
            "is" | "are" | "am" | "does" | "do" | "has" | "have" | "can" => return true,
            "did" | "was" | "were" | "had" => return false,
            _ => {}
        }
    }
    false
}

/// Whether a question asks when: it starts with "when", or asks what or which date,
/// day, month or year.
pub(crate) fn asks_when(question: &str) -> bool {
    let words: Vec<String> = question
        .split(|c: char| !c.is_alphanumeric())
        .filter(|w| !w.is_empty())
        .take(2)
        .map(str::to_lowercase)
        .collect();
    match words.as_slice() {
        [first, ..] if first == "when" => true,
        [what, unit] => {
            matches!(what.as_str(), "what" | "which")
                && matches!(unit.as_str(), "date" | "day" | "month" | "year")
        }
        _ => false,
    }
}

/// A question asking when answered by code: of every passage found (none left out for a
/// token budget), the one whose turn bears most on the question ([`best_passage`]),
/// cited, and that turn's date ([`passage_date`]). `None` when that turn has no date
/// code can read (it writes one out, or has no time): the model reads the passages.
fn dated_by_code(
    tokenizer: &dyn TextTokenizer,
    question: &str,
    hits: Vec<Evidence>,
) -> Result<Option<Asked>> {
    let mut passages: Vec<Evidence> = evidence_passages(tokenizer, question, hits, usize::MAX)?
        .into_iter()
        .map(|(_, e)| e)
        .collect();
    let Some(best) = best_passage(&passages, question) else {
        return Ok(None);
    };
    let e = &passages[best];
    let Some(date) = passage_date(&e.hit.text, question, continued(e)) else {
        return Ok(None);
    };
    let turn = bearing_line(&e.hit.text, question, continued(e)).map(|(line, _)| {
        let at = line.as_ptr() as usize - e.hit.text.as_ptr() as usize;
        e.turn_at(at, at + line.len())
    });
    passages[best].cited = true;
    passages[best].turn = turn;
    Ok(Some(Asked {
        made: Some(date),
        found: Vec::new(),
        passages,
        units: Vec::new(),
        notes: None,
    }))
}

/// The passage holding the turn that bears most on a question asking when (see
/// [`when_rank`]), the search's better ranked of equals.
fn best_passage(passages: &[Evidence], question: &str) -> Option<usize> {
    let best_turn = |e: &Evidence| {
        timed_lines(&e.hit.text, continued(e))
            .into_iter()
            .map(|(line, at)| when_rank(line, at, question))
            .max()
            .unwrap_or_default()
    };
    (0..passages.len()).max_by(|&a, &b| {
        let (pa, pb) = (&passages[a], &passages[b]);
        best_turn(pa)
            .cmp(&best_turn(pb))
            .then(pa.hit.score.total_cmp(&pb.hit.score))
    })
}

/// The time of the chat turn a found passage starts in, which dates its first lines when
/// it was cut inside that turn.
fn continued(e: &Evidence) -> Option<NaiveDateTime> {
    e.hit.time.as_deref().and_then(dates::parse_time)
}

/// The lines of `passage`, each with the time of its chat turn or of the last timed turn
/// before it in the passage (a chat log may stamp only a session's first turn); the
/// lines before its first turn, with `continued`, the time of the turn it was cut from.
fn timed_lines(
    passage: &str,
    continued: Option<NaiveDateTime>,
) -> Vec<(&str, Option<NaiveDateTime>)> {
    let mut at = continued;
    passage
        .lines()
        .map(|line| {
            if let Some(t) = turn_time(line).and_then(dates::parse_time) {
                at = Some(t);
            }
            (line, at)
        })
        .collect()
}

/// What a line says of when: a relative date resolved against its time, a date written
/// out, or neither.
enum Says {
    Relative(String),
    Written,
    Nothing,
}

fn says(line: &str, at: Option<NaiveDateTime>, question: &str) -> Says {
    let body = turn_body(line);
    match at.and_then(|at| bearing_date(body, at, question)) {
        Some(means) => Says::Relative(means),
        None if dates::names_a_date(body) => Says::Written,
        None => Says::Nothing,
    }
}

/// Of the relative dates `text` says at `at`, resolved, the one in the sentence that
/// shares the most of the question's words, the first of equals: "On Friday I got the
/// news. Next month I fly to Porto." answers when the flight is with next month.
fn bearing_date(text: &str, at: NaiveDateTime, question: &str) -> Option<String> {
    dates::resolve(text, at)
        .into_iter()
        .map(|r| {
            let sentence = dates::sentence_around(text, r.start, r.end);
            (coverage(sentence, question), r.means)
        })
        .rev()
        .max_by_key(|(shared, _)| *shared)
        .map(|(_, means)| means)
}

/// How much a turn bears on a question asking when: the question's words it shares,
/// then whether it says when (a relative date, "yesterday", or a date written out),
/// which tells a turn about the event from one that merely mentions it.
fn when_rank(line: &str, at: Option<NaiveDateTime>, question: &str) -> (usize, bool) {
    let says_when = !matches!(says(line, at, question), Says::Nothing);
    (coverage(line, question), says_when)
}

/// A chat turn's words without its time.
fn turn_body(line: &str) -> &str {
    &line[line.find("] ").map_or(0, |i| i + 2)..]
}

/// The date of the line of `passage` that bears most on `question` (see [`when_rank`];
/// the first of equals): the relative date it says ([`bearing_date`]: of several, the
/// one in the sentence sharing most of the question's words), resolved against its
/// turn's time ("yesterday" said on 8 May 2023: "7 May 2023"), else the day it was said;
/// measured on LoCoMo's development conversations, every temporal question (154): the
/// first of a turn's dates 0.556, the bearing sentence's 0.560 (1 answer better). `None`
/// when it has no time, or when it writes a date out ("Kofi's birthday is December
/// 27"): the model reads it.
pub fn passage_date(
    passage: &str,
    question: &str,
    continued: Option<NaiveDateTime>,
) -> Option<String> {
    let (line, at) = bearing_line(passage, question, continued)?;
    match says(line, at, question) {
        Says::Relative(means) => Some(means),
        Says::Written => None,
        Says::Nothing => at.map(|at| dates::day(at.date())),
    }
}

/// When the line of `passage` that bears most on `question` was said: its chat turn's
/// time, or the last time shown before it; `None` for text without a time.
fn said_at(
    passage: &str,
    question: &str,
    continued: Option<NaiveDateTime>,
) -> Option<NaiveDateTime> {
    bearing_line(passage, question, continued)?.1
}

/// The line of `passage` that bears most on `question` (see [`when_rank`]; the first of
/// equals), with its time ([`timed_lines`]).
fn bearing_line<'a>(
    passage: &'a str,
    question: &str,
    continued: Option<NaiveDateTime>,
) -> Option<(&'a str, Option<NaiveDateTime>)> {
    timed_lines(passage, continued)
        .into_iter()
        .rev()
        .max_by_key(|&(line, at)| when_rank(line, at, question))
}

/// Whether a question asks for every value: what it asks for is plural. Either the noun
/// after "what" or "which" is ("What pets does Ana have?", "Which hidden numbers were
/// recorded?", "What kinds of art …": the noun before "of"), or "what" is followed by
/// "are" or "were" ("What are Ana's hobbies?"). The noun phrase ends at the first form
/// of be, do, have or get. Read from the grammar, not from words such as "all" or
/// "list": real questions ask for a list far more often by a plural than by such a word.
pub(crate) fn asks_for_all(question: &str) -> bool {
    let words: Vec<String> = question
        .split(|c: char| !c.is_alphanumeric() && c != '\'' && c != '\u{2019}')
        .filter(|w| !w.is_empty())
        .map(|w| w.to_lowercase().replace('\u{2019}', "'"))
        .collect();
    let [first, rest @ ..] = words.as_slice() else {
        return false;
    };
    if !matches!(first.as_str(), "what" | "which") {
        return false;
    }
    if rest
        .first()
        .is_some_and(|w| matches!(w.as_str(), "are" | "were"))
    {
        return true;
    }
    let phrase: Vec<&str> = rest
        .iter()
        .map(String::as_str)
        .take_while(|w| !RESTATING.contains(w))
        .collect();
    let head = match phrase.iter().position(|w| *w == "of") {
        Some(of) if of > 0 => phrase[of - 1],
        _ => match phrase.last() {
            Some(last) => last,
            None => return false,
        },
    };
    is_plural(head)
}

/// Whether a lower-case word reads as a plural noun: it ends in "s" (not "ss", "us" or
/// "is", not a possessive) and its Porter stem drops that ending ("books" → "book",
/// "activities" → "activ").
fn is_plural(word: &str) -> bool {
    word.len() >= 4
        && word.ends_with('s')
        && !word.ends_with("ss")
        && !word.ends_with("us")
        && !word.ends_with("is")
        && !word.ends_with("'s")
        && stems(word).first().is_some_and(|s| s != word)
}

/// An answer made without the model.
fn made_answer(reply: String) -> AnswerReport {
    AnswerReport {
        answer: reply.clone(),
        reply,
        template: PASSAGE_ANSWER,
        prompt_tokens: 0,
        completion_tokens: 0,
        stop_reason: memagent_engine::StopReason::EndOfTurn,
        seconds: 0.0,
        timings: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_answer_does_not_open_by_repeating_the_question() {
        let cut = |q, a| without_restatement(q, a);
        assert_eq!(
            cut(
                "What does Ana say running has been great for?",
                "Ana says running has been great for her mental health."
            ),
            "her mental health."
        );
        assert_eq!(
            cut(
                "What did Kofi recently get promoted to?",
                "Kofi recently got promoted to assistant manager"
            ),
            "assistant manager"
        );
        // An answer that opens with what is asked for, or is nothing but the
        // question's words, stays whole.
        assert_eq!(cut("What country is Ana from?", "Sweden"), "Sweden");
        assert_eq!(
            cut("Where does Ravi live?", "Ravi lives in Graz."),
            "in Graz."
        );
        assert_eq!(
            cut("Is Ravi married?", "Ravi is married."),
            "Ravi is married."
        );
    }

    #[test]
    fn a_reply_that_asks_or_abstains_tells_nothing() {
        let q = "Did Ana and Ben grow up with a dog?";
        assert_eq!(told(q, q), None);
        assert_eq!(told(q, &format!("Question: {q}")), None);
        assert_eq!(
            told(q, "Wow, that looks great! What kind of dog is it?"),
            None
        );
        assert_eq!(told(q, "not known"), None);
        assert_eq!(
            told(q, "Yes, they grew up with a dog named Rex.\nQuestion: …").as_deref(),
            Some("Yes, they grew up with a dog named Rex.")
        );
        let q = "Where does Ravi live?";
        assert_eq!(told(q, "Ravi lives in Graz.").as_deref(), Some("in Graz."));
    }

    #[test]
    fn a_single_value_comes_from_the_newest_passage_that_says() {
        let q = "Where does my sister Ravi live?";
        let said = [
            Some("My sister Ravi lives in Graz."),
            None,
            Some("Ravi moved to Krakow last month."),
            None,
        ];
        let notes = Some("Ravi lives in Oslo.".to_string());
        let (answer, cited) = chosen_answer(
            q,
            &said,
            &[true; 4],
            &[Beside::default(); 4],
            &[None; 4],
            &[0; 4],
            notes,
        );
        assert_eq!(answer, "Ravi moved to Krakow last month.");
        assert_eq!(cited, [2]);
    }

    #[test]
    fn a_question_of_something_said_once_gets_the_passage_found_first() {
        // Two occasions: the search ranks the baking that the question names first; the
        // newer passage answers of another day.
        let said = [Some("A lemon cake."), Some("Bread.")];
        let found = [0, 1];
        let answer = |q: &str| {
            chosen_answer(
                q,
                &said,
                &[true; 2],
                &[Beside::default(); 2],
                &[None; 2],
                &found,
                None,
            )
        };
        assert_eq!(
            answer("What did Ana bake for Ben's party?"),
            ("A lemon cake.".to_string(), vec![0])
        );
        assert_eq!(answer("Who baked for Ben's party?").0, "A lemon cake.");
        // Asked of now, the newest says (a change replaces what was said before).
        assert_eq!(
            answer("What does Ana bake these days?"),
            ("Bread.".to_string(), vec![1])
        );
    }

    #[test]
    fn a_question_in_the_present_tense_asks_of_now() {
        for q in [
            "Where does my sister Ravi live?",
            "What is the name of Ana's dog?",
            "In which city does Ben live?",
            "What's Ana's job?",
            "Who are Ben's neighbours?",
        ] {
            assert!(asks_of_now(q), "{q}");
        }
        for q in [
            "What did Ana bake?",
            "Where was Ben born?",
            "Who moved to Porto?",
            "Which of Ana's friends visited Graz?",
            "How long had Ben played the cello before the concert?",
        ] {
            assert!(!asks_of_now(q), "{q}");
        }
    }

    #[test]
    fn a_changed_fact_is_the_one_said_latest_by_the_times_shown() {
        let q = "Where does Ravi live?";
        // A chat of August, then notes of March imported after it: log order puts the
        // notes last, their times put them first.
        let texts = [
            "[2023-08-02 18:30] user (Ana): Ravi moved to Krakow last week.",
            "[2023-03-01 09:00] user: Ravi lives in Graz.",
        ];
        let said = [Some("Krakow"), Some("Graz")];
        let at: Vec<Option<NaiveDateTime>> = texts.iter().map(|t| said_at(t, q, None)).collect();
        assert_eq!(
            at[1].map(|t| t.date()),
            chrono::NaiveDate::from_ymd_opt(2023, 3, 1)
        );
        let (answer, cited) = chosen_answer(
            q,
            &said,
            &[true; 2],
            &[Beside::default(); 2],
            &at,
            &[0; 2],
            None,
        );
        assert_eq!((answer.as_str(), cited), ("Krakow", vec![0]));
        // Without times, the last in the log.
        let (answer, _) = chosen_answer(
            q,
            &said,
            &[true; 2],
            &[Beside::default(); 2],
            &[None; 2],
            &[0; 2],
            None,
        );
        assert_eq!(answer, "Graz");
        // The last without a time keeps its place against an older one with one (a
        // chat log stamping only the first turn of a session).
        let (answer, _) = chosen_answer(
            q,
            &said,
            &[true; 2],
            &[Beside::default(); 2],
            &[at[0], None],
            &[0; 2],
            None,
        );
        assert_eq!(answer, "Graz");
        assert_eq!(said_at("Ravi lives in Graz.", q, None), None);
    }

    fn beside_all(texts: &[&str], said: &[Option<&str>], q: &str) -> Vec<Beside> {
        texts
            .iter()
            .zip(said)
            .map(|(t, s)| Beside::of(t, s.unwrap(), q))
            .collect()
    }

    #[test]
    fn a_single_answer_comes_from_a_passage_whose_turn_bears_on_the_question() {
        let q = "Which city is Ravi's aunt from?";
        // The small model answers from every passage it is shown: the newer passage's
        // answer comes from a turn about a trip.
        let texts = [
            "[2023-05-08 13:56] user (Ana): Which city is your aunt from?\n\
             [2023-05-08 13:57] user (Ravi): Porto! She moved here at twenty.",
            "[2023-07-02 10:00] user (Ana): How was your summer?\n\
             [2023-07-02 10:01] user (Ravi): Thanks! We went to Rome last summer.",
        ];
        let said = [Some("Porto."), Some("Rome.")];
        let beside = beside_all(&texts, &said, q);
        let at: Vec<Option<NaiveDateTime>> = texts.iter().map(|t| said_at(t, q, None)).collect();
        let (answer, cited) = chosen_answer(q, &said, &[true; 2], &beside, &at, &[0; 2], None);
        assert_eq!((answer.as_str(), cited), ("Porto.", vec![0]));
        // A change said in other words still replaces what was said before.
        let q = "Where does Ravi live?";
        let texts = [
            "[2023-03-01 09:00] user (Ravi): I live in Graz, near the river.",
            "[2023-08-02 18:30] user (Ravi): Big news, I moved to Krakow!",
        ];
        let said = [Some("Graz."), Some("Krakow.")];
        let beside = beside_all(&texts, &said, q);
        let at: Vec<Option<NaiveDateTime>> = texts.iter().map(|t| said_at(t, q, None)).collect();
        let (answer, _) = chosen_answer(q, &said, &[true; 2], &beside, &at, &[0; 2], None);
        assert_eq!(answer, "Krakow.");
        // So is one naming whom the question asks about, with fewer of its other words.
        let q = "Where does my sister Ravi live?";
        let texts = [
            "[2023-03-01 09:00] user (Ana): My sister Ravi lives in Graz.",
            "[2023-08-02 18:30] user (Ana): Ravi moved to Krakow last month.",
        ];
        let beside = beside_all(&texts, &said, q);
        assert_eq!(beside[0].words, beside[1].words + 2);
        let (answer, _) = chosen_answer(q, &said, &[true; 2], &beside, &at, &[0; 2], None);
        assert_eq!(answer, "Krakow.");
    }

    #[test]
    fn a_reader_s_answer_is_its_passage_s_words_or_a_misreading() {
        let passage = "[2026-01-05 10:00] user: The wifi password at the cabin is cobalt79.";
        assert!(copied("cobalt79.", passage));
        assert!(copied("Cobalt79", passage));
        // A word the passage does not hold, or holds only in part.
        assert!(!copied("Coal79.", passage));
        assert!(!copied("Coal.", passage));
        // One letter's slip, or a longer word's first six letters, still count.
        let passage = "[2023-05-08 13:57] user (Ravi): My neighbour works as a librarian.";
        assert!(copied("a librarien", passage));
        assert!(copied("Librarians.", passage));
        assert!(!copied("a dentist", passage));
    }

    #[test]
    fn an_answer_that_only_frames_a_turn_says_nothing() {
        let passage = "[2024-03-11 09:40] user (Ana): I moved to Porto with my aunt.\n\
                       user (Ben): Nice! … [2024-03-12 09:00] user (Ben): How is Porto?";
        // A turn's time, its clock or its day, a turn copied with its label.
        for framing in [
            "2024-03-11 09:40",
            "09:40.",
            "2024-03-11",
            "09:00",
            "user (Ana): I moved to Porto with my aunt.",
        ] {
            assert!(frames_a_turn(framing, passage), "{framing}");
        }
        // What a turn says, or a time no turn shows.
        for said in [
            "Porto.",
            "with my aunt",
            "18:30",
            "11 March 2024",
            "2024",
            "03-11",
        ] {
            assert!(!frames_a_turn(said, passage), "{said}");
        }
    }

    #[test]
    fn answers_from_passages_about_something_else_are_set_aside() {
        // A move says less of the question and still counts.
        let q = "Where does my sister Ravi live?";
        let texts = [
            "user: My sister Ravi lives in Graz.",
            "user: Ravi moved to Krakow.",
        ];
        let said = [Some("Ravi lives in Graz."), Some("Ravi moved to Krakow.")];
        assert_eq!(about_the_question(q, &texts, &said), [true, true]);
        // Two words fewer: another gate.
        let q = "What is the access code for the north gate?";
        let texts = [
            "The access code for the north gate is 4817263.",
            "The access code for the boathouse is 5550123.",
        ];
        let said = [Some("It is 4817263."), Some("It is 5550123.")];
        assert_eq!(about_the_question(q, &texts, &said), [true, false]);
        // One word fewer, but the one that singles it out.
        let q = "What is the access code for the cellar?";
        let texts = [
            "The access code for the cellar is 4522457.",
            "The access code for the east wing is 8922960.",
            "Dinner at eight.",
        ];
        let said = [Some("It is 4522457."), Some("It is 8922960."), None];
        assert_eq!(about_the_question(q, &texts, &said), [true, false, false]);
        let (answer, cited) = chosen_answer(
            q,
            &said,
            &[true, false, false],
            &[Beside::default(); 3],
            &[None; 3],
            &[0; 3],
            None,
        );
        assert_eq!((answer.as_str(), cited), ("It is 4522457.", vec![0]));
    }

    #[test]
    fn a_list_gathers_every_distinct_value_oldest_first() {
        let q = "Which hidden numbers were recorded for the Danube? List all of them.";
        let said = [
            Some("The number is 41."),
            Some("The number is 7."),
            None,
            Some("the number is 41."),
        ];
        let (answer, cited) = chosen_answer(
            q,
            &said,
            &[true; 4],
            &[Beside::default(); 4],
            &[None; 4],
            &[0; 4],
            None,
        );
        assert_eq!(answer, "The number is 41, The number is 7");
        assert_eq!(cited, [0, 1]);
    }

    #[test]
    fn the_notes_answer_only_when_no_passage_says_then_not_known() {
        let q = "When is Kofi's birthday?";
        let (answer, cited) = chosen_answer(
            q,
            &[None, None],
            &[true; 2],
            &[Beside::default(); 2],
            &[None; 2],
            &[0; 2],
            Some("On May 2.".into()),
        );
        assert_eq!((answer.as_str(), cited.len()), ("On May 2.", 0));
        let (answer, cited) = chosen_answer(
            q,
            &[None],
            &[true],
            &[Beside::default()],
            &[None],
            &[0],
            None,
        );
        assert!(abstains(&answer), "{answer}");
        assert!(cited.is_empty());
    }

    #[test]
    fn a_when_question_gets_the_date_of_the_turn_that_bears_on_it() {
        let passage = "[2023-05-08 13:56] user (Ana): I went to the climbing gym yesterday.\n\
                       [2023-05-08 13:57] user (Ravi): Wow, that's cool, Ana!\n\
                       [2023-05-08 13:58] user (Ana): The route setters were great.\n";
        let q = "When did Ana go to the climbing gym?";
        assert!(asks_when(q));
        assert_eq!(
            passage_date(passage, q, None).as_deref(),
            Some("7 May 2023")
        );
        // No relative date: the day the turn was said.
        let q = "When did Ana meet the route setters?";
        assert_eq!(
            passage_date(passage, q, None).as_deref(),
            Some("8 May 2023")
        );
        assert_eq!(passage_date("No time here.", q, None), None);
        // Of two turns sharing as many words, the one saying when the event was.
        let passage = "[2023-05-08 13:56] user (Ana): The climbing gym opens on Fridays.\n\
                       [2023-05-08 13:57] user (Ana): I went to the climbing gym yesterday.\n";
        let q = "When did Ana go to the climbing gym?";
        assert_eq!(
            passage_date(passage, q, None).as_deref(),
            Some("7 May 2023")
        );
        // A turn that writes its date out is left to the model, stamped or not.
        let passage = "[2026-01-15 09:00] user: Can you suggest a quick lunch idea?\n\
                       assistant: Noted.\n\
                       user: My cousin Kofi's birthday is on December 27.\n\
                       assistant: I'll remember Kofi's birthday.\n";
        assert_eq!(
            passage_date(passage, "When is Kofi's birthday?", None),
            None
        );
        // An unstamped turn has the time of the session's stamped one.
        let passage = "[2026-01-15 09:00] user: Hello.\nuser: Kofi moved to Oslo yesterday.\n";
        assert_eq!(
            passage_date(passage, "When did Kofi move to Oslo?", None).as_deref(),
            Some("14 January 2026")
        );
        // Of two dates in a turn, the one in the sentence the question is about.
        let passage = "[2024-03-11 10:00] user (Ana): On Friday I got the job! \
                       Next month I fly to Porto to see my aunt.\n";
        assert_eq!(
            passage_date(passage, "When does Ana fly to Porto?", None).as_deref(),
            Some("April 2024")
        );
        assert_eq!(
            passage_date(passage, "When did Ana get the job?", None).as_deref(),
            Some("Friday 8 March 2024")
        );
        assert!(!asks_when("In which year did Ana open her store?"));
        assert!(asks_when("What year did Ana open her store?"));
        assert!(!asks_when("What did Ana open?"));
    }

    #[test]
    fn what_one_speaker_said_of_themselves_is_not_mentioned_of_the_other() {
        let texts = [
            "[2023-05-25 13:14] user (Ravi): I ran a half marathon last Saturday.\n\
             [2023-05-25 13:15] user (Ana): Your half marathon sounds amazing! How did it go?\n\
             [2023-05-25 13:16] user (Ravi): Thanks, Ana! I realised rest days matter.",
            "[2023-06-09 10:00] user (Ana): I gave a talk at a school last week.",
        ];
        let q = "What did Ana realize after her half marathon?";
        assert_eq!(
            said_by_another(q, &texts),
            Some(("Ana".to_string(), "Ravi".to_string()))
        );
        // Asked of the one who said it, or of both, it is theirs to answer.
        assert_eq!(
            said_by_another("What did Ravi realize after his half marathon?", &texts),
            None
        );
        assert_eq!(
            said_by_another("What did Ravi and Ana realize after the race?", &texts),
            None
        );
        // Ana's own words count for her: had she said she ran one, it is hers to answer.
        let both = [texts[0].replace("Your half marathon sounds", "My half marathon was")];
        let both: Vec<&str> = both.iter().map(String::as_str).collect();
        assert_eq!(said_by_another(q, &both), None);
        // A question turn counts for the one asked: the answer may be theirs.
        let asked = [
            "[2023-05-25 13:15] user (Ana): How did your half marathon go, Ravi?\n\
                      [2023-05-25 13:16] user (Ravi): Great, thanks!",
        ];
        assert_eq!(
            said_by_another("How did Ravi's half marathon go?", &asked),
            None
        );
        // Without speakers' names there is no one else.
        assert_eq!(
            said_by_another(q, &["I ran a half marathon and realised it."]),
            None
        );
        // A guess about Ana may rest on what Ravi said: the model is asked.
        assert_eq!(
            said_by_another("Would Ana likely run a half marathon?", &texts),
            None
        );
        assert_eq!(
            said_by_another("What might Ana realize after a half marathon?", &texts),
            None
        );
    }

    #[test]
    fn an_answer_is_its_first_line_without_a_passage_label() {
        assert_eq!(
            first_line("\nPassage 2: Ravi lives in Ghent.\nPassage 3: Ravi moved."),
            "Ravi lives in Ghent."
        );
        assert_eq!(
            first_line("Passage: The code is 4411."),
            "The code is 4411."
        );
        assert!(abstains("Not known."));
        assert!(abstains("The passage does not say."));
        assert!(abstains(
            "The passage does not specify what bread they baked."
        ));
        assert!(abstains("It does not mention a date."));
        assert!(abstains("  "));
        assert!(!abstains("Ravi lives in Ghent."));
    }

    #[test]
    fn a_question_asking_for_a_plural_is_answered_with_every_value() {
        // Lists asked for by a plural, with no word such as "all" or "list".
        for q in [
            "Which cities has Ravi visited?",
            "What pets does Ana have?",
            "What kinds of art does Kofi make?",
            "What are Lena's dogs' names?",
            "what were the gifts for the party?",
            "Which hidden numbers were recorded for the Danube? List all of them.",
            "What outdoor activities has Olek done other than hiking?",
        ] {
            assert!(asks_for_all(q), "{q}");
        }
        // One value asked for, whatever words the question holds.
        for q in [
            "Where does Ravi live?",
            "Is it small?",
            "What book did Kofi recommend?",
            "What is Ana's job?",
            "What country is Kofi's grandma from?",
            "Which city have both Ana and Kofi visited?",
            "What does Ana say running has been great for?",
            "What kind of dogs does Ana have?",
            "How many books has Ravi read?",
        ] {
            assert!(!asks_for_all(q), "{q}");
        }
    }
}
