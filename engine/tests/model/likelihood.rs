//! A reply's likelihood on the real default model.

use memagent_engine::{log_probability, Error, LoadOptions, LocalModel, Message, Weights};

use crate::support::{model, model_path};

fn messages() -> Vec<Message> {
    vec![Message::user(
        "Ana: I keep bees on the roof of my flat in Porto.\nBen: How many hives?\n\n\
         Write a question that the chat above answers.",
    )]
}

/// The mean log-probability of a reply read in pieces equals the one its tokens get
/// decoded one at a time after the prompt, each predicted from those before it.
#[test]
fn a_reply_likelihood_is_the_mean_of_each_token_predicted_after_those_before_it() {
    let m = model();
    // Longer than one piece of `forward_all`, so that pieces join.
    let reply = "Where does Ana keep her bees, and how many hives does she keep on the roof of \
                 her flat?";
    let got = m
        .reply_log_probability(&messages(), reply, Weights::Base)
        .unwrap();
    let prompt = m.chat_prompt_ids(&messages()).unwrap();
    let ids = m.tokenizer().encode(reply, false).unwrap();
    assert!(ids.len() > memagent_engine::Transformer::MAX_VERIFY + 2);
    let t = m.transformer();
    let mut cache = t.new_cache_with(1, prompt.len() + ids.len(), Weights::Base);
    let mut logits = t.forward(&[prompt], &mut cache).unwrap();
    let mut sum = 0.0;
    for &token in &ids {
        sum += log_probability(&logits.flatten_all().unwrap().to_vec1().unwrap(), token);
        logits = t.forward(&[vec![token]], &mut cache).unwrap();
    }
    let want = sum / ids.len() as f64;
    assert!(got < 0.0, "{got}");
    assert!(
        (got - want).abs() < 1e-9,
        "in pieces {got}, one at a time {want}"
    );
}

/// A question the passage answers is likelier after it than one it does not.
#[test]
fn a_question_the_chat_answers_is_likelier_than_another() {
    let m = model();
    let score = |q: &str| {
        m.reply_log_probability(&messages(), q, Weights::Base)
            .unwrap()
    };
    let about = score("Where does Ana keep her bees?");
    let other = score("What did the fencing club decide about the tournament budget?");
    assert!(about > other, "{about} vs {other}");
}

#[test]
fn an_empty_reply_or_one_past_the_context_is_an_error() {
    let m = model();
    assert!(matches!(
        m.reply_log_probability(&messages(), "", Weights::Base),
        Err(Error::InvalidRequest(_))
    ));
    let long = "bee ".repeat(9_000);
    assert!(matches!(
        m.reply_log_probability(&messages(), &long, Weights::Base),
        Err(Error::ContextOverflow { .. })
    ));
}

/// A prompt scored once is kept: another reply to it reads only its own tokens and gets
/// the same value, to the bit, as with nothing kept; past the budget of bytes the least
/// recently used prompt goes, and a budget of 0 keeps none.
#[test]
fn a_prompt_scored_once_is_kept_and_scores_another_reply_the_same() {
    // A model of its own: the kept prompts are the model's state.
    let m = LocalModel::load(&model_path(), &LoadOptions::default()).unwrap();
    let other = vec![Message::user(
        "Ben: The fencing club meets on Tuesdays now.\n\n\
         Write a question that the chat above answers.",
    )];
    let score = |messages: &[Message], reply: &str| {
        m.reply_log_probability(messages, reply, Weights::Base)
            .unwrap()
    };
    let (first, second) = ("Where does Ana keep her bees?", "How many hives are there?");
    assert_eq!(m.scored_prompt_stats().prompts, 0);
    score(&messages(), first);
    let one = m.scored_prompt_stats();
    assert_eq!(one.prompts, 1);
    let kept = score(&messages(), second);
    assert_eq!(m.scored_prompt_stats(), one, "the same prompt is kept once");
    m.clear_scored_prompts();
    assert_eq!(m.scored_prompt_stats().prompts, 0);
    let fresh = score(&messages(), second);
    assert_eq!(
        kept.to_bits(),
        fresh.to_bits(),
        "kept {kept}, fresh {fresh}"
    );

    // Room for one prompt: the other replaces it.
    m.set_scored_prompt_budget(one.bytes + one.bytes / 2);
    score(&other, "When does the fencing club meet?");
    let stats = m.scored_prompt_stats();
    assert_eq!(stats.prompts, 1);
    assert!(stats.bytes <= one.bytes + one.bytes / 2, "{stats:?}");
    m.set_scored_prompt_budget(0);
    assert_eq!(m.scored_prompt_stats().prompts, 0);
    assert_eq!(score(&messages(), second).to_bits(), fresh.to_bits());
    assert_eq!(m.scored_prompt_stats().prompts, 0);
}

/// A prompt read ahead is kept as one scored is: the first reply scored to it reads only
/// its own tokens and gets the same value, to the bit, as with nothing kept; reading it
/// again reads nothing.
#[test]
fn a_prompt_read_ahead_scores_a_reply_as_if_read_with_it() {
    // A model of its own: the kept prompts are the model's state.
    let m = LocalModel::load(&model_path(), &LoadOptions::default()).unwrap();
    let reply = "Where does Ana keep her bees?";
    let fresh = m
        .reply_log_probability(&messages(), reply, Weights::Base)
        .unwrap();
    m.clear_scored_prompts();

    let kept = m.keep_scored_prompt(&messages(), Weights::Base).unwrap();
    assert!(kept.read);
    let stats = m.scored_prompt_stats();
    assert_eq!((stats.prompts, stats.bytes), (1, kept.bytes));
    let again = m.keep_scored_prompt(&messages(), Weights::Base).unwrap();
    assert!(!again.read, "a kept prompt is not read again");
    assert_eq!(again.bytes, kept.bytes);
    let ahead = m
        .reply_log_probability(&messages(), reply, Weights::Base)
        .unwrap();
    assert_eq!(
        m.scored_prompt_stats(),
        stats,
        "the reply found its prompt kept"
    );
    assert_eq!(
        ahead.to_bits(),
        fresh.to_bits(),
        "ahead {ahead}, fresh {fresh}"
    );

    // With a budget of 0 the prompt is read and not kept.
    m.set_scored_prompt_budget(0);
    let none = m.keep_scored_prompt(&messages(), Weights::Base).unwrap();
    assert_eq!((none.read, none.bytes), (true, 0));
    assert_eq!(m.scored_prompt_stats().prompts, 0);
}
