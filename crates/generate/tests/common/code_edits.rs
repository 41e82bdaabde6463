//! The 20 generated code-edit prompts of issue 31's gates: five functions, each with four
//! edits (a rename, a doc comment, a new parameter, a verbatim repeat).

const FUNCTIONS: [&str; 5] = [
    "def total_price(items, tax):\n    subtotal = 0\n    for item in items:\n        subtotal += item.price * item.count\n    return subtotal * (1 + tax)\n",
    "def find_user(users, name):\n    for user in users:\n        if user.name == name:\n            return user\n    return None\n",
    "fn count_words(text: &str) -> usize {\n    let mut count = 0;\n    for word in text.split_whitespace() {\n        if !word.is_empty() {\n            count += 1;\n        }\n    }\n    count\n}\n",
    "function average(values) {\n  let sum = 0;\n  for (const v of values) {\n    sum += v;\n  }\n  return sum / values.length;\n}\n",
    "def read_config(path):\n    with open(path) as f:\n        lines = f.readlines()\n    config = {}\n    for line in lines:\n        key, value = line.split('=')\n        config[key.strip()] = value.strip()\n    return config\n",
];

const EDITS: [&str; 4] = [
    "Rewrite this function with the first variable renamed to `acc`. Reply with the code only.",
    "Add a docstring or doc comment to this function and change nothing else. Reply with the code only.",
    "Rewrite this function so that it also accepts an optional `verbose` parameter that is unused. Reply with the code only.",
    "Repeat this function exactly, then say one sentence about it.",
];

pub fn prompts() -> Vec<String> {
    let mut out = Vec::new();
    for f in FUNCTIONS {
        for e in EDITS {
            out.push(format!("{e}\n\n```\n{f}```"));
        }
    }
    out
}
