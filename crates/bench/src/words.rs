//! A word list for synthetic prompts: common short English words that BPE
//! tokenizers (GPT-2, Llama, SmolLM) encode as one token each with their
//! leading space, so N words ≈ N tokens.

/// Common single-token words.
pub const WORDS: &[&str] = &[
    "the", "of", "and", "to", "in", "is", "was", "that", "for", "on", "it", "with", "as", "he",
    "be", "by", "at", "this", "had", "not", "are", "but", "from", "or", "have", "an", "they",
    "which", "one", "you", "were", "her", "all", "she", "there", "would", "their", "we", "him",
    "been", "has", "when", "who", "will", "more", "no", "if", "out", "so", "said", "what", "up",
    "its", "about", "into", "than", "them", "can", "only", "other", "new", "some", "could", "time",
    "these", "two", "may", "then", "do", "first", "any", "my", "now", "such", "like", "our",
    "over", "man", "me", "even", "most", "made", "after", "also", "did", "many", "before", "must",
    "through", "back", "years", "where", "much", "your", "way", "well", "down", "should",
    "because", "each", "just", "those", "people", "how", "too", "little", "state", "good", "very",
    "make", "world", "still", "own", "see", "men", "work", "long", "get", "here", "between",
    "both", "life", "being", "under", "never", "day", "same", "another", "know", "while", "last",
    "might", "us", "great", "old", "year", "off", "come", "since", "against", "go", "came",
    "right", "used", "take", "three", "small", "large", "next", "house", "water", "light", "city",
    "road", "tree", "river", "book", "music", "game", "table", "window", "garden", "school",
    "family", "story", "paper", "market", "money", "power", "line", "point", "number", "part",
    "place", "case", "week", "group", "problem", "fact", "hand", "eye", "side", "head", "face",
    "home", "room", "area", "night", "morning", "food", "field", "form", "level", "order", "car",
    "door", "voice", "team", "idea", "body", "word", "name", "music", "art", "war", "history",
    "party", "result", "change", "reason", "south", "north", "east", "west", "open", "short",
    "young", "early", "late", "high", "low", "real", "best", "free", "sure", "clear", "red",
    "blue", "green", "black", "white", "cold", "warm", "fast", "slow", "hard", "easy", "full",
    "half",
];
