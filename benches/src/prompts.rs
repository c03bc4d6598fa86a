//! The committed prompt set: the 12 greedy prompts of the upstream evaluation (3 chat, 9 plain), used by
//! the fidelity benchmark and the serving load benchmark.

/// One prompt: plain text for a completion, or a chat's messages (role, content) for a chat template.
#[derive(Debug, Clone)]
pub enum BenchPrompt {
    /// Text continued as it is.
    Plain(&'static str),
    /// Messages rendered by the model's chat template, with the generation prompt.
    Chat(Vec<(&'static str, String)>),
}

/// A named prompt of the set.
#[derive(Debug, Clone)]
pub struct NamedPrompt {
    /// `chat_short`, `chat_long`, `chat_tools`, `plain_0` … `plain_8`.
    pub name: String,
    /// The prompt.
    pub prompt: BenchPrompt,
}

/// The plain prompts.
pub const PLAIN: [&str; 9] = [
    "The capital of Australia is",
    "In 1969, the Apollo 11 mission",
    "def fibonacci(n):\n    \"\"\"Return the nth Fibonacci number.\"\"\"\n",
    "The three laws of thermodynamics state that",
    "To make a proper espresso you need",
    "The difference between TCP and UDP is",
    "Photosynthesis converts",
    "A binary search tree is a data structure that",
    "The Treaty of Westphalia was signed in",
];

/// The 12 prompts: the three chats first, then the plain ones.
pub fn prompt_set() -> Vec<NamedPrompt> {
    let inventory: Vec<String> =
        (1..120).map(|i| format!("Item {i}: the code for warehouse district {i} is {}.", 1000 + i * 7)).collect();
    let chats = [
        ("chat_short", vec![("user", "What is the capital of France? Answer in one word.".to_string())]),
        (
            "chat_long",
            vec![(
                "user",
                format!(
                    "Here is an inventory listing.\n{}\nWhat is the code for warehouse district 73? Answer with just the number.",
                    inventory.join(" ")
                ),
            )],
        ),
        (
            // Upstream also passes a get_weather tool schema; this set passes none.
            "chat_tools",
            vec![
                ("system", "You are a helpful assistant with tools.".to_string()),
                ("user", "What is the weather in Shenzhen right now, in celsius?".to_string()),
            ],
        ),
    ];
    let mut out: Vec<NamedPrompt> = chats
        .into_iter()
        .map(|(name, messages)| NamedPrompt { name: name.to_string(), prompt: BenchPrompt::Chat(messages) })
        .collect();
    out.extend(
        PLAIN
            .iter()
            .enumerate()
            .map(|(i, p)| NamedPrompt { name: format!("plain_{i}"), prompt: BenchPrompt::Plain(p) }),
    );
    out
}
