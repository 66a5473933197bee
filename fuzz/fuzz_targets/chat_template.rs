//! The default model's chat template over arbitrary messages: rendering and encoding
//! never panic, control tokens come only from the template (one `<|im_start|>` per turn),
//! and the ids decode back to the rendered text.
#![no_main]

use libfuzzer_sys::fuzz_target;
use sloserve_model::chat_template::ChatMessage;

const ROLES: [&str; 4] = ["system", "user", "assistant", "tool"];

fuzz_target!(|data: &[u8]| {
    let f = sloserve_fuzz::fixture();
    let (tok, tmpl) = (&f.tokenizer, &f.template);
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    // Messages separated by 0xFF bytes; each one's first byte picks its role.
    let messages: Vec<ChatMessage> = rest
        .split(|&b| b == 0xFF)
        .take(8)
        .filter_map(|m| {
            let (&r, text) = m.split_first()?;
            let role = ROLES[r as usize % ROLES.len()];
            Some(ChatMessage::new(
                role,
                f.encodable(&String::from_utf8_lossy(text)),
            ))
        })
        .collect();
    let gen = head & 1 != 0;
    let Ok(text) = tmpl.render(&messages, gen) else {
        return;
    };
    let ids = tmpl.encode(tok, &messages, gen, false).unwrap();
    assert_eq!(tok.decode(&ids, false).unwrap(), text);
    let im_start = tok.encode("<|im_start|>", true).unwrap()[0];
    let turns = ids.iter().filter(|&&t| t == im_start).count();
    let default_system =
        messages.first().is_none_or(|m| m.role != "system") && !messages.is_empty();
    let want = messages.len() + usize::from(gen) + usize::from(default_system);
    assert_eq!(turns, want, "{messages:?}");
});
