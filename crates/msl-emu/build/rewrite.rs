//! Rewrites one `.metal` file into C++ for the emulator (used by build.rs, unit-tested from
//! the library). Line structure is kept 1:1 so `#line 1 "<file>"` maps every C++ line back.
//!
//! * `T name [[buffer(i)]]` -> `T name = ::emu::arg_buffer<T>(i)` (likewise `[[threadgroup(i)]]`
//!   and the builtins such as `[[thread_position_in_grid]]`), so every emulated thread calls
//!   the kernel with no arguments and each parameter reads the thread's context.
//! * A kernel-scope `threadgroup T name[N];` -> a reference into the threadgroup arena.
//! * Each kernel is registered by name with its buffer/threadgroup bindings.

/// One kernel parameter binding.
#[derive(Debug, Clone, PartialEq)]
pub struct Binding {
    /// 0 buffer, 1 threadgroup, 2 builtin (matches `emu::ParamKind`).
    pub kind: u8,
    pub index: u32,
    /// The parameter's declared type (address-space words included).
    pub ty: String,
}

#[derive(Debug, Clone, PartialEq)]
pub struct Kernel {
    pub name: String,
    pub bindings: Vec<Binding>,
}

#[derive(Debug)]
pub struct Rewritten {
    pub cpp: String,
    pub kernels: Vec<Kernel>,
}

const BUILTINS: &[(&str, &str)] = &[
    ("thread_position_in_grid", "B_THREAD_POSITION_IN_GRID"),
    (
        "threadgroup_position_in_grid",
        "B_THREADGROUP_POSITION_IN_GRID",
    ),
    (
        "thread_position_in_threadgroup",
        "B_THREAD_POSITION_IN_THREADGROUP",
    ),
    (
        "thread_index_in_threadgroup",
        "B_THREAD_INDEX_IN_THREADGROUP",
    ),
    ("threads_per_threadgroup", "B_THREADS_PER_THREADGROUP"),
    ("threadgroups_per_grid", "B_THREADGROUPS_PER_GRID"),
    (
        "simdgroup_index_in_threadgroup",
        "B_SIMDGROUP_INDEX_IN_THREADGROUP",
    ),
    ("thread_index_in_simdgroup", "B_THREAD_INDEX_IN_SIMDGROUP"),
    ("threads_per_simdgroup", "B_THREADS_PER_SIMDGROUP"),
    ("simdgroups_per_threadgroup", "B_SIMDGROUPS_PER_THREADGROUP"),
    ("threads_per_grid", "B_THREADS_PER_GRID"),
];

fn is_ident(c: char) -> bool {
    c.is_ascii_alphanumeric() || c == '_'
}

/// Index of the bracket closing the one at `open` (`(`/`{`), skipping nested pairs.
fn matching(src: &str, open: usize) -> Result<usize, String> {
    let bytes = src.as_bytes();
    let (o, c) = match bytes[open] {
        b'(' => (b'(', b')'),
        b'{' => (b'{', b'}'),
        _ => return Err(format!("no bracket at byte {open}")),
    };
    let mut depth = 0usize;
    for (i, &b) in bytes.iter().enumerate().skip(open) {
        if b == o {
            depth += 1;
        } else if b == c {
            depth -= 1;
            if depth == 0 {
                return Ok(i);
            }
        }
    }
    Err(format!("unbalanced bracket at byte {open}"))
}

fn line_of(src: &str, at: usize) -> usize {
    src[..at].matches('\n').count() + 1
}

/// Splits a parameter list on commas outside (), <> and [[ ]].
fn split_params(list: &str) -> Vec<&str> {
    let mut out = Vec::new();
    let mut depth = 0i32;
    let mut start = 0;
    for (i, ch) in list.char_indices() {
        match ch {
            '(' | '<' | '[' => depth += 1,
            ')' | '>' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.push(&list[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    if !list[start..].trim().is_empty() {
        out.push(&list[start..]);
    }
    out
}

fn rewrite_param(param: &str, file: &str, line: usize) -> Result<(String, Binding), String> {
    let lead_len = param.len() - param.trim_start().len();
    let (lead, body) = param.split_at(lead_len);
    let open = body.find("[[").ok_or_else(|| {
        format!(
            "{file}:{line}: kernel parameter `{}` has no [[attribute]]",
            body.trim()
        )
    })?;
    let close = body[open..]
        .find("]]")
        .map(|c| c + open)
        .ok_or_else(|| format!("{file}:{line}: unterminated [[ in `{}`", body.trim()))?;
    let decl = body[..open].trim();
    let attr = body[open + 2..close].trim();
    let name_start = decl
        .rfind(|c: char| !is_ident(c))
        .map(|i| i + 1)
        .unwrap_or(0);
    let name = &decl[name_start..];
    let ty = decl[..name_start].trim();
    if name.is_empty() || ty.is_empty() {
        return Err(format!(
            "{file}:{line}: cannot split `{decl}` into type and name"
        ));
    }
    let num = |prefix: &str| -> Option<Result<u32, String>> {
        attr.strip_prefix(prefix).map(|rest| {
            rest.trim_end_matches(')')
                .trim()
                .parse::<u32>()
                .map_err(|e| format!("{file}:{line}: bad index in [[{attr}]]: {e}"))
        })
    };
    let (expr, binding) = if let Some(i) = num("buffer(") {
        let i = i?;
        (
            format!("::emu::arg_buffer<{ty}>({i})"),
            Binding {
                kind: 0,
                index: i,
                ty: ty.to_string(),
            },
        )
    } else if let Some(i) = num("threadgroup(") {
        let i = i?;
        (
            format!("::emu::arg_threadgroup<{ty}>({i})"),
            Binding {
                kind: 1,
                index: i,
                ty: ty.to_string(),
            },
        )
    } else if let Some((_, b)) = BUILTINS.iter().find(|(n, _)| *n == attr) {
        (
            format!("::emu::builtin<{ty}>(::emu::{b})"),
            Binding {
                kind: 2,
                index: 0,
                ty: ty.to_string(),
            },
        )
    } else {
        return Err(format!(
            "{file}:{line}: unsupported kernel attribute [[{attr}]]"
        ));
    };
    let newlines = body.matches('\n').count();
    Ok((
        format!("{lead}{ty} {name} = {expr}{}", "\n".repeat(newlines)),
        binding,
    ))
}

/// `threadgroup T name[N]...;` at kernel scope -> arena reference; other lines unchanged.
fn rewrite_tg_decl(line: &str, next_id: &mut u32) -> Option<String> {
    let t = line.trim();
    let rest = t.strip_prefix("threadgroup ")?;
    let rest = rest.strip_suffix(';')?;
    let (decl, dims) = match rest.find('[') {
        Some(i) => (rest[..i].trim(), rest[i..].trim()),
        None => (rest.trim(), ""),
    };
    // A pointer into threadgroup memory (`threadgroup float * p = ...;`) is an ordinary
    // local; the address-space macro handles it. Sizes may contain `*` (`[4 * 64]`).
    if decl.contains('=')
        || decl.contains('*')
        || decl.contains('(')
        || decl.contains(',')
        || rest.contains('=')
    {
        return None;
    }
    let name_start = decl.rfind(|c: char| !is_ident(c)).map(|i| i + 1)?;
    let name = &decl[name_start..];
    let ty = decl[..name_start].trim();
    let indent = &line[..line.len() - line.trim_start().len()];
    let id = *next_id;
    *next_id += 1;
    Some(format!(
        "{indent}auto & {name} = ::emu::tg_static_ref<{ty}{dims}>({id});"
    ))
}

/// Rewrites `src` (the text of `file`); `stem` names the registration function
/// `emu_register_<stem>`; `id_base` keeps threadgroup-variable ids unique across files.
pub fn rewrite(src: &str, file: &str, stem: &str, id_base: u32) -> Result<Rewritten, String> {
    let mut out = String::with_capacity(src.len() * 2);
    let mut kernels = Vec::new();
    let mut pos = 0;
    let mut next_id = id_base;
    let mut search = 0;
    while let Some(rel) = src[search..].find("kernel void ") {
        let at = search + rel;
        search = at + 1;
        let bol = at == 0 || !is_ident(src[..at].chars().next_back().unwrap_or(' '));
        if !bol {
            continue;
        }
        let line = line_of(src, at);
        let name_start = at + "kernel void ".len();
        let open = src[name_start..]
            .find('(')
            .map(|i| i + name_start)
            .ok_or_else(|| format!("{file}:{line}: kernel without a parameter list"))?;
        let name = src[name_start..open].trim().to_string();
        let close = matching(src, open)?;
        let body_open = src[close..]
            .find('{')
            .map(|i| i + close)
            .ok_or_else(|| format!("{file}:{line}: kernel `{name}` has no body"))?;
        let body_close = matching(src, body_open)?;
        out.push_str(&src[pos..open + 1]);
        let mut bindings = Vec::new();
        let params = split_params(&src[open + 1..close]);
        let mut rewritten = Vec::new();
        for p in params {
            let (text, b) = rewrite_param(p, file, line)?;
            rewritten.push(text);
            bindings.push(b);
        }
        out.push_str(&rewritten.join(","));
        out.push_str(&src[close..body_open]);
        for (i, l) in src[body_open..=body_close].split('\n').enumerate() {
            if i > 0 {
                out.push('\n');
            }
            match rewrite_tg_decl(l, &mut next_id) {
                Some(r) => out.push_str(&r),
                None => out.push_str(l),
            }
        }
        pos = body_close + 1;
        search = pos;
        kernels.push(Kernel { name, bindings });
    }
    out.push_str(&src[pos..]);
    out.push_str(&format!(
        "\n#line 1 \"<emu-registration:{file}>\"\nextern \"C\" void emu_register_{stem}() {{\n"
    ));
    for k in &kernels {
        let mut infos = Vec::new();
        for b in &k.bindings {
            if b.kind == 2 {
                continue;
            }
            let size = if b.kind == 0 {
                format!("::emu::ref_size<{}>()", b.ty)
            } else {
                "0".to_string()
            };
            infos.push(format!("{{{}, {}, {}}}", b.kind, b.index, size));
        }
        // a zero-length array is not C++; pad with an unused builtin entry
        if infos.is_empty() {
            infos.push("{2, 0, 0}".to_string());
        }
        out.push_str(&format!(
            "    {{ static const ::emu::ParamInfo ps[] = {{{}}}; ::emu::register_kernel(\"{}\", +[] {{ {}(); }}, ps, {}, \"{file}\"); }}\n",
            infos.join(", "),
            k.name,
            k.name,
            infos.len()
        ));
    }
    out.push_str("}\n");
    Ok(Rewritten {
        cpp: format!("#line 1 \"{file}\"\n{out}"),
        kernels,
    })
}
