/*
 * Conformance vector runner for the C ABI (libretrywise, include/retrywise.h).
 *
 * Reads the line format written by tests/vectors/to_lines.py (from a file
 * argument or stdin), replays every vector through the public C API with a
 * manual clock and a fixed seed, and compares each result with the vector's
 * expectations using the rules shared by every runner (see README.md):
 * subset match, null = absent, integers exact, other numbers within 1e-9.
 * Stats come back from rw_engine_stats_json as JSON; a small path lookup
 * below reads the values the vector names.
 *
 *   python3 tests/vectors/to_lines.py > /tmp/vectors.lines
 *   cc -std=c11 -Wall -Wextra -I bindings-ffi/include tests/vectors/run_c.c \
 *      -L "$LIBDIR" -lretrywise -o /tmp/run_c && LD_LIBRARY_PATH="$LIBDIR" /tmp/run_c /tmp/vectors.lines
 *
 * Exit status: 0 when every vector matches, 1 on any mismatch, 2 on bad input.
 */
#define _POSIX_C_SOURCE 200809L
#include "retrywise.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------ utilities -- */

static void *xmalloc(size_t n) {
  void *p = malloc(n ? n : 1);
  if (!p) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return p;
}

static void *xrealloc(void *p, size_t n) {
  void *q = realloc(p, n ? n : 1);
  if (!q) {
    fprintf(stderr, "out of memory\n");
    exit(2);
  }
  return q;
}

static char *xstrndup(const char *s, size_t n) {
  char *r = xmalloc(n + 1);
  if (n) memcpy(r, s, n);
  r[n] = '\0';
  return r;
}

static char *xstrdup(const char *s) { return xstrndup(s, strlen(s)); }

static int hexval(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

/* Decodes one percent-encoded token; a bare "%" is the empty string. */
static char *decode(const char *t) {
  size_t n = strlen(t), j = 0;
  char *out = xmalloc(n + 1);
  if (n == 1 && t[0] == '%') n = 0;
  for (size_t i = 0; i < n; i++) {
    if (t[i] == '%' && i + 2 < n && hexval(t[i + 1]) >= 0 && hexval(t[i + 2]) >= 0) {
      out[j++] = (char)(hexval(t[i + 1]) * 16 + hexval(t[i + 2]));
      i += 2;
    } else {
      out[j++] = t[i];
    }
  }
  out[j] = '\0';
  return out;
}

typedef struct {
  char **v;
  size_t n;
} toks;

static toks split(const char *line) {
  toks t = {NULL, 0};
  size_t cap = 0;
  const char *p = line;
  while (*p) {
    while (*p == ' ') p++;
    if (!*p || *p == '\n' || *p == '\r') break;
    const char *s = p;
    while (*p && *p != ' ' && *p != '\n' && *p != '\r') p++;
    char *raw = xstrndup(s, (size_t)(p - s));
    if (t.n == cap) {
      cap = cap ? cap * 2 : 16;
      t.v = xrealloc(t.v, cap * sizeof(char *));
    }
    t.v[t.n++] = decode(raw);
    free(raw);
  }
  return t;
}

static void toks_free(toks *t) {
  for (size_t i = 0; i < t->n; i++) free(t->v[i]);
  free(t->v);
  t->v = NULL;
  t->n = 0;
}

static rw_str S(const char *s) {
  rw_str r = {s, s ? strlen(s) : 0};
  return r;
}

/* ------------------------------------------------------ typed values -- */

typedef enum { T_NULL, T_STR, T_INT, T_FLOAT, T_BOOL, T_RAW } vtype;

typedef struct {
  char *path;
  vtype t;
  char *s; /* T_STR, T_RAW */
  long long i;
  unsigned long long u;
  int is_unsigned;
  double f;
  int b;
} val;

typedef struct {
  val *v;
  size_t n, cap;
} vals;

static val *vals_add(vals *a, const char *path, vtype t) {
  if (a->n == a->cap) {
    a->cap = a->cap ? a->cap * 2 : 32;
    a->v = xrealloc(a->v, a->cap * sizeof(val));
  }
  val *x = &a->v[a->n++];
  memset(x, 0, sizeof *x);
  x->path = xstrdup(path);
  x->t = t;
  return x;
}

static void add_str(vals *a, const char *path, rw_str s) {
  if (!s.ptr) {
    vals_add(a, path, T_NULL);
    return;
  }
  vals_add(a, path, T_STR)->s = xstrndup(s.ptr, s.len);
}

static void add_cstr(vals *a, const char *path, const char *s) {
  if (!s) {
    vals_add(a, path, T_NULL);
    return;
  }
  vals_add(a, path, T_STR)->s = xstrdup(s);
}

static void add_uint(vals *a, const char *path, unsigned long long u) {
  val *x = vals_add(a, path, T_INT);
  x->u = u;
  x->is_unsigned = 1;
  x->i = (long long)u;
}

static void add_bool(vals *a, const char *path, int b) { vals_add(a, path, T_BOOL)->b = b != 0; }

static void vals_free(vals *a) {
  for (size_t i = 0; i < a->n; i++) {
    free(a->v[i].path);
    free(a->v[i].s);
  }
  free(a->v);
  memset(a, 0, sizeof *a);
}

static const val *vals_get(const vals *a, const char *path) {
  for (size_t i = 0; i < a->n; i++)
    if (strcmp(a->v[i].path, path) == 0) return &a->v[i];
  return NULL;
}

/* JSON-ish rendering for messages. */
static void render(const val *v, char *buf, size_t n) {
  if (!v) {
    snprintf(buf, n, "null");
    return;
  }
  switch (v->t) {
  case T_NULL: snprintf(buf, n, "null"); break;
  case T_STR: snprintf(buf, n, "\"%s\"", v->s); break;
  case T_RAW: snprintf(buf, n, "%s", v->s); break;
  case T_INT:
    if (v->is_unsigned) snprintf(buf, n, "%llu", v->u);
    else snprintf(buf, n, "%lld", v->i);
    break;
  case T_FLOAT: snprintf(buf, n, "%.17g", v->f); break;
  case T_BOOL: snprintf(buf, n, "%s", v->b ? "true" : "false"); break;
  }
}

static double num_of(const val *v) {
  if (v->t == T_FLOAT) return v->f;
  return v->is_unsigned ? (double)v->u : (double)v->i;
}

/* Shared comparison rule for one leaf. */
static int same(const val *e, const val *a) {
  if (e->t == T_NULL) return !a || a->t == T_NULL;
  if (!a) return 0;
  switch (e->t) {
  case T_STR: return a->t == T_STR && strcmp(e->s, a->s) == 0;
  case T_BOOL: return a->t == T_BOOL && e->b == a->b;
  case T_INT:
  case T_FLOAT:
    if (a->t != T_INT && a->t != T_FLOAT) return 0;
    if (e->t == T_INT && a->t == T_INT) {
      if (e->is_unsigned && a->is_unsigned) return e->u == a->u;
      return e->i == a->i;
    }
    return fabs(num_of(e) - num_of(a)) <= 1e-9;
  default: return 0;
  }
}

/* ---------------------------------------------------------- JSON lookup -- */

static const char *ws(const char *p) {
  while (*p == ' ' || *p == '\n' || *p == '\r' || *p == '\t') p++;
  return p;
}

/* Skips one JSON value; returns the byte after it (NULL on malformed input). */
static const char *skip_value(const char *p) {
  p = ws(p);
  if (*p == '"') {
    for (p++; *p && *p != '"'; p++)
      if (*p == '\\' && p[1]) p++;
    return *p ? p + 1 : NULL;
  }
  if (*p == '{' || *p == '[') {
    char close = *p == '{' ? '}' : ']';
    p = ws(p + 1);
    if (*p == close) return p + 1;
    for (;;) {
      if (close == '}') {
        p = skip_value(p); /* key */
        if (!p) return NULL;
        p = ws(p);
        if (*p != ':') return NULL;
        p++;
      }
      p = skip_value(p);
      if (!p) return NULL;
      p = ws(p);
      if (*p == ',') {
        p++;
        continue;
      }
      return *p == close ? p + 1 : NULL;
    }
  }
  while (*p && *p != ',' && *p != '}' && *p != ']' && *p != ' ' && *p != '\n') p++;
  return p;
}

/* Decodes a JSON string starting at the opening quote (\uXXXX in the BMP
 * becomes UTF-8; raw bytes are copied). */
static char *json_string(const char *p, const char **end) {
  size_t cap = 32, n = 0;
  char *out = xmalloc(cap);
  for (p++; *p && *p != '"'; p++) {
    if (n + 4 >= cap) out = xrealloc(out, cap *= 2);
    if (*p != '\\') {
      out[n++] = *p;
      continue;
    }
    p++;
    unsigned cp;
    switch (*p) {
    case 'n': out[n++] = '\n'; continue;
    case 't': out[n++] = '\t'; continue;
    case 'r': out[n++] = '\r'; continue;
    case 'b': out[n++] = '\b'; continue;
    case 'f': out[n++] = '\f'; continue;
    case 'u':
      cp = 0;
      for (int k = 1; k <= 4; k++) {
        int h = p[k] ? hexval(p[k]) : -1;
        if (h < 0) break;
        cp = cp * 16 + (unsigned)h;
      }
      p += 4;
      break;
    case '\0': p--; continue;
    default: out[n++] = *p; continue;
    }
    if (cp < 0x80) {
      out[n++] = (char)cp;
    } else if (cp < 0x800) {
      out[n++] = (char)(0xC0 | (cp >> 6));
      out[n++] = (char)(0x80 | (cp & 0x3F));
    } else {
      out[n++] = (char)(0xE0 | (cp >> 12));
      out[n++] = (char)(0x80 | ((cp >> 6) & 0x3F));
      out[n++] = (char)(0x80 | (cp & 0x3F));
    }
  }
  out[n] = '\0';
  if (end) *end = *p ? p + 1 : p;
  return out;
}

/* Finds the value at a dotted path of object keys; NULL when absent. */
static const char *json_find(const char *json, const char *path) {
  const char *p = ws(json);
  char *segs = xstrdup(path);
  const char *result = p;
  for (char *seg = segs; seg && result;) {
    char *dot = strchr(seg, '.');
    if (dot) *dot = '\0';
    p = ws(result);
    result = NULL;
    if (*p == '{') {
      p = ws(p + 1);
      while (*p == '"') {
        const char *after;
        char *key = json_string(p, &after);
        p = ws(after);
        if (*p != ':') {
          free(key);
          break;
        }
        p = ws(p + 1);
        int hit = strcmp(key, seg) == 0;
        free(key);
        if (hit) {
          result = p;
          break;
        }
        p = skip_value(p);
        if (!p) break;
        p = ws(p);
        if (*p == ',') p = ws(p + 1);
      }
    }
    seg = dot ? dot + 1 : NULL;
  }
  free(segs);
  return result;
}

/* Reads the JSON value at `p` as a typed value (objects/arrays raw). */
static void json_val(const char *p, vals *into, const char *path) {
  p = ws(p);
  if (*p == '"') {
    vals_add(into, path, T_STR)->s = json_string(p, NULL);
  } else if (strncmp(p, "true", 4) == 0) {
    add_bool(into, path, 1);
  } else if (strncmp(p, "false", 5) == 0) {
    add_bool(into, path, 0);
  } else if (strncmp(p, "null", 4) == 0) {
    vals_add(into, path, T_NULL);
  } else if (*p == '{' || *p == '[') {
    const char *e = skip_value(p);
    vals_add(into, path, T_RAW)->s = xstrndup(p, e ? (size_t)(e - p) : strlen(p));
  } else {
    const char *e = skip_value(p);
    char *num = xstrndup(p, e ? (size_t)(e - p) : strlen(p));
    if (strpbrk(num, ".eE")) {
      vals_add(into, path, T_FLOAT)->f = strtod(num, NULL);
    } else if (num[0] == '-') {
      vals_add(into, path, T_INT)->i = strtoll(num, NULL, 10);
    } else {
      add_uint(into, path, strtoull(num, NULL, 10));
    }
    free(num);
  }
}

/* ------------------------------------------------------- vocabularies -- */

typedef struct {
  const char *name;
  int code;
} name_code;

static const name_code ERROR_KINDS[] = {
    {"dns", RW_ERROR_KIND_DNS},
    {"connect", RW_ERROR_KIND_CONNECT},
    {"tls", RW_ERROR_KIND_TLS},
    {"write", RW_ERROR_KIND_WRITE},
    {"connect_timeout", RW_ERROR_KIND_CONNECT_TIMEOUT},
    {"first_byte_timeout", RW_ERROR_KIND_FIRST_BYTE_TIMEOUT},
    {"stream_idle_timeout", RW_ERROR_KIND_STREAM_IDLE_TIMEOUT},
    {"deadline_exceeded", RW_ERROR_KIND_DEADLINE_EXCEEDED},
    {"connection_reset", RW_ERROR_KIND_CONNECTION_RESET},
    {"cancelled", RW_ERROR_KIND_CANCELLED},
    {"malformed_response", RW_ERROR_KIND_MALFORMED_RESPONSE},
    {"other", RW_ERROR_KIND_OTHER},
    {NULL, 0},
};
static const name_code PHASES[] = {
    {"before_send", RW_PHASE_BEFORE_SEND}, {"sent", RW_PHASE_SENT},
    {"headers", RW_PHASE_HEADERS},         {"stream_open", RW_PHASE_STREAM_OPEN},
    {"stream_visible", RW_PHASE_STREAM_VISIBLE}, {NULL, 0},
};
static const name_code EFFECTS[] = {
    {"none", RW_EFFECT_NONE}, {"pending", RW_EFFECT_PENDING},
    {"confirmed", RW_EFFECT_CONFIRMED}, {"unknown", RW_EFFECT_UNKNOWN}, {NULL, 0},
};
static const name_code CONTINUATIONS[] = {
    {"prefill", RW_CONTINUATION_PREFILL}, {"instruction", RW_CONTINUATION_INSTRUCTION}, {NULL, 0},
};
static const name_code IDEMPOTENCY[] = {
    {"safe", RW_IDEMPOTENCY_SAFE}, {"keyed", RW_IDEMPOTENCY_KEYED},
    {"unsafe", RW_IDEMPOTENCY_UNSAFE}, {NULL, 0},
};

static int code_of(const name_code *t, const char *name, int *ok) {
  for (; t->name; t++)
    if (strcmp(t->name, name) == 0) return t->code;
  *ok = 0;
  return -1;
}

static const char *on_failure_name(rw_on_failure o) {
  switch (o) {
  case RW_ON_FAILURE_FAIL: return "fail";
  case RW_ON_FAILURE_MANUAL_REVIEW: return "manual_review";
  default: return NULL;
  }
}

static const char *class_name(rw_error_class c) {
  if (c == RW_ERROR_CLASS_NONE) return NULL;
  return rw_class_name(c);
}

/* ------------------------------------------------------------ the run -- */

typedef struct {
  char *name;
  rw_call *call;
} named_call;

typedef struct {
  char *path;
  val v;
} expectation;

typedef enum { K_NONE, K_VALS, K_STATS, K_ATTEMPT } actual_kind;

typedef struct {
  /* vector */
  char *vector;
  unsigned long long seed;
  rw_engine *engine;
  int broken;
  named_call *calls;
  size_t ncalls, capcalls;
  int vector_mismatches;
  /* current step */
  char *label;
  actual_kind kind;
  int got_stop;
  vals actual;
  char *stats_json;
  expectation *exp;
  size_t nexp, capexp;
  long long within_lo, within_hi;
  int has_within;
  char *contains;
  /* totals */
  int vectors, failed, mismatches, skipped;
} run;

static void mismatch(run *r, const char *field, const char *expected, const char *actual) {
  printf("vector %s step %s: %s: expected %s, got %s\n", r->vector, r->label ? r->label : "-", field, expected, actual);
  r->vector_mismatches++;
  r->mismatches++;
}

static rw_call **call_slot(run *r, const char *name, int create) {
  for (size_t i = 0; i < r->ncalls; i++)
    if (strcmp(r->calls[i].name, name) == 0) return &r->calls[i].call;
  if (!create) return NULL;
  if (r->ncalls == r->capcalls) {
    r->capcalls = r->capcalls ? r->capcalls * 2 : 16;
    r->calls = xrealloc(r->calls, r->capcalls * sizeof(named_call));
  }
  r->calls[r->ncalls].name = xstrdup(name);
  r->calls[r->ncalls].call = NULL;
  return &r->calls[r->ncalls++].call;
}

static void step_reset(run *r) {
  free(r->label);
  r->label = NULL;
  vals_free(&r->actual);
  free(r->stats_json);
  r->stats_json = NULL;
  for (size_t i = 0; i < r->nexp; i++) {
    free(r->exp[i].path);
    free(r->exp[i].v.s);
  }
  r->nexp = 0;
  r->has_within = 0;
  free(r->contains);
  r->contains = NULL;
  r->kind = K_NONE;
  r->got_stop = 0;
}

/* Compares the finished step's actual result with its expectations. */
static void step_check(run *r) {
  char eb[512], ab[512];
  if (r->broken || !r->label) return;
  if (r->kind == K_ATTEMPT && r->nexp > 0) {
    int wants_stop = 0;
    for (size_t i = 0; i < r->nexp; i++)
      if (strncmp(r->exp[i].path, "stop.", 5) == 0) wants_stop = 1;
    if (wants_stop != r->got_stop) {
      const val *what = vals_get(&r->actual, r->got_stop ? "stop.reason" : "number");
      render(what, ab, sizeof ab);
      char got[600];
      snprintf(got, sizeof got, "%s %s", r->got_stop ? "stop" : "attempt", ab);
      mismatch(r, "result", wants_stop ? "stop" : "attempt", got);
      return;
    }
  }
  for (size_t i = 0; i < r->nexp; i++) {
    const expectation *e = &r->exp[i];
    vals tmp = {0};
    const val *a;
    if (r->kind == K_STATS) {
      const char *at = r->stats_json ? json_find(r->stats_json, e->path) : NULL;
      if (at) json_val(at, &tmp, e->path);
      a = at ? &tmp.v[0] : NULL;
    } else {
      a = vals_get(&r->actual, e->path);
    }
    if (!same(&e->v, a)) {
      render(&e->v, eb, sizeof eb);
      render(a, ab, sizeof ab);
      /* A begin or reload that failed unexpectedly: say why. */
      const val *why = strcmp(e->path, "ok") == 0 ? vals_get(&r->actual, "error") : NULL;
      if (why && why->t == T_STR) {
        size_t n = strlen(ab);
        snprintf(ab + n, sizeof ab - n, " (%s)", why->s);
      }
      mismatch(r, e->path, eb, ab);
    }
    vals_free(&tmp);
  }
  if (r->has_within) {
    const val *d = vals_get(&r->actual, "delay_ms");
    if (!d || d->t != T_INT || d->i < r->within_lo || d->i > r->within_hi) {
      snprintf(eb, sizeof eb, "[%lld,%lld]", r->within_lo, r->within_hi);
      render(d, ab, sizeof ab);
      mismatch(r, "delay_within_ms", eb, ab);
    }
  }
  if (r->contains) {
    const val *m = vals_get(&r->actual, "error");
    if (!m || m->t != T_STR || !strstr(m->s, r->contains)) {
      snprintf(eb, sizeof eb, "\"%s\"", r->contains);
      render(m, ab, sizeof ab);
      mismatch(r, "error_contains", eb, ab);
    }
  }
}

static void vector_end(run *r) {
  if (!r->vector) return;
  step_check(r);
  step_reset(r);
  for (size_t i = 0; i < r->ncalls; i++) {
    rw_call_free(r->calls[i].call);
    free(r->calls[i].name);
  }
  free(r->calls);
  r->calls = NULL;
  r->ncalls = r->capcalls = 0;
  rw_engine_free(r->engine);
  r->engine = NULL;
  r->vectors++;
  if (r->vector_mismatches) r->failed++;
  free(r->vector);
  r->vector = NULL;
}

/* Value of key `k` in pairs t->v[from..] (NULL when absent). */
static const char *arg(const toks *t, size_t from, const char *k) {
  for (size_t i = from; i + 1 < t->n; i += 2)
    if (strcmp(t->v[i], k) == 0) return t->v[i + 1];
  return NULL;
}

/* A request a transport reads: `PREFIXurl S`, `PREFIXheader NAME VALUE`
 * (repeated), `PREFIXbody S` among the step's arguments from `from`. */
typedef struct {
  int given;
  const char *url, *body;
  rw_header headers[32];
  size_t nheaders;
} request_args;

/* Takes the request argument at t->v[*i] when it is one (advancing *i). */
static int take_request_arg(request_args *q, const toks *t, size_t *i, const char *prefix) {
  size_t n = strlen(prefix);
  const char *k = t->v[*i];
  if (strncmp(k, prefix, n) != 0) return 0;
  k += n;
  if (strcmp(k, "header") == 0 && *i + 2 < t->n) {
    if (q->nheaders < 32) {
      q->headers[q->nheaders].name = S(t->v[*i + 1]);
      q->headers[q->nheaders].value = S(t->v[*i + 2]);
      q->nheaders++;
    }
    *i += 3;
  } else if (strcmp(k, "url") == 0 && *i + 1 < t->n) {
    q->url = t->v[*i + 1];
    *i += 2;
  } else if (strcmp(k, "body") == 0 && *i + 1 < t->n) {
    q->body = t->v[*i + 1];
    *i += 2;
  } else {
    return 0;
  }
  q->given = 1;
  return 1;
}

/* rw_request_read of the request; NULL (with a mismatch) when it fails. */
static rw_request *read_request(run *r, const request_args *q) {
  rw_request *req = NULL;
  rw_result rc = rw_request_read(S(q->url), q->nheaders ? q->headers : NULL, q->nheaders, (const uint8_t *)q->body,
                                 q->body ? strlen(q->body) : 0, &req);
  if (rc != RW_OK) mismatch(r, "rw_request_read", "RW_OK", rw_result_name(rc));
  return req;
}

static void do_begin(run *r, const toks *t, const char *call) {
  rw_call_spec spec;
  memset(&spec, 0, sizeof spec);
  rw_str caps[32];
  rw_header inbound[32];
  size_t ncaps = 0, ninb = 0;
  request_args q;
  memset(&q, 0, sizeof q);
  for (size_t i = 4; i < t->n;) {
    const char *k = t->v[i];
    if (strcmp(k, "inbound") == 0 && i + 2 < t->n) {
      if (ninb < 32) {
        inbound[ninb].name = S(t->v[i + 1]);
        inbound[ninb].value = S(t->v[i + 2]);
        ninb++;
      }
      i += 3;
      continue;
    }
    if (take_request_arg(&q, t, &i, "request_")) continue;
    if (i + 1 >= t->n) break;
    const char *v = t->v[i + 1];
    if (strcmp(k, "route") == 0) spec.route = S(v);
    else if (strcmp(k, "deadline_ms") == 0) spec.deadline_ms = strtoull(v, NULL, 10);
    else if (strcmp(k, "idempotency") == 0) {
      int ok = 1;
      spec.idempotency = code_of(IDEMPOTENCY, v, &ok);
      if (!ok) mismatch(r, "spec.idempotency", "a known name", v);
    } else if (strcmp(k, "tenant") == 0) spec.tenant = S(v);
    else if (strcmp(k, "task") == 0) spec.task = S(v);
    else if (strcmp(k, "priority") == 0) spec.priority = S(v);
    else if (strcmp(k, "idempotency_key") == 0) spec.idempotency_key = S(v);
    else if (strcmp(k, "params_digest") == 0) spec.params_digest = S(v);
    else if (strcmp(k, "cap") == 0) {
      if (ncaps < 32) caps[ncaps++] = S(v);
    } else if (strcmp(k, "input_tokens") == 0) spec.input_tokens = strtoull(v, NULL, 10);
    else if (strcmp(k, "max_output_tokens") == 0) spec.max_output_tokens = strtoull(v, NULL, 10);
    else if (strcmp(k, "data_boundary") == 0) spec.data_boundary = S(v);
    else if (strcmp(k, "max_cost") == 0) spec.max_cost = strtod(v, NULL);
    else mismatch(r, "spec", "a known field", k);
    i += 2;
  }
  spec.capabilities = ncaps ? caps : NULL;
  spec.capabilities_len = ncaps;
  spec.inbound_headers = ninb ? inbound : NULL;
  spec.inbound_headers_len = ninb;
  /* The request's needs under the spec's; the call copies them, so the
   * request is freed at once. */
  rw_request *req = q.given ? read_request(r, &q) : NULL;
  spec.request = req;
  rw_call *begun = NULL;
  rw_error *err = NULL;
  rw_result rc = rw_call_begin_err(r->engine, &spec, &begun, &err);
  rw_request_free(req);
  /* As in the other runners, a refused begin leaves the name as it was. */
  if (begun) {
    rw_call **slot = call_slot(r, call, 1);
    rw_call_free(*slot);
    *slot = begun;
  }
  /* {"ok": true} or {"ok": false, "error": message} (a route the policy does not know). */
  r->kind = K_VALS;
  add_bool(&r->actual, "ok", rc == RW_OK);
  if (rc != RW_OK) {
    add_cstr(&r->actual, "error", err ? rw_error_message(err) : rw_result_name(rc));
    if (rc != RW_ERR_POLICY) mismatch(r, "rw_call_begin_err", "RW_OK or RW_ERR_POLICY", rw_result_name(rc));
  }
  rw_error_free(err);
}

/* read_request: the canonical view of what rw_request_read read. */
static void do_read_request(run *r, const toks *t) {
  request_args q;
  memset(&q, 0, sizeof q);
  for (size_t i = 4; i < t->n;)
    if (!take_request_arg(&q, t, &i, "")) {
      mismatch(r, "read_request", "url, header or body", t->v[i]);
      i++;
    }
  rw_request *req = read_request(r, &q);
  if (!req) return;
  vals *v = &r->actual;
  r->kind = K_VALS;
  add_cstr(v, "family", rw_api_family_name(rw_request_family(req)));
  add_cstr(v, "endpoint", rw_request_endpoint(req));
  add_str(v, "model", rw_request_model(req));
  size_t cap = 64, len = 0, n = rw_request_capability_count(req);
  char *caps = xmalloc(cap);
  for (size_t i = 0; i < n; i++) {
    rw_str c = rw_request_capability(req, i);
    while (len + c.len + 2 > cap) caps = xrealloc(caps, cap *= 2);
    if (i) caps[len++] = ',';
    memcpy(caps + len, c.ptr, c.len);
    len += c.len;
  }
  caps[len] = '\0';
  add_cstr(v, "needs.capabilities", caps);
  free(caps);
  /* A request's needs carry its wire family. */
  add_cstr(v, "needs.api", rw_api_family_name(rw_request_family(req)));
  int64_t in = rw_request_input_tokens(req), out = rw_request_max_output_tokens(req);
  if (in < 0) vals_add(v, "needs.input_tokens", T_NULL);
  else add_uint(v, "needs.input_tokens", (unsigned long long)in);
  if (out < 0) vals_add(v, "needs.max_output_tokens", T_NULL);
  else add_uint(v, "needs.max_output_tokens", (unsigned long long)out);
  rw_request_free(req);
}

/* An attempt's canonical view under `prefix` ("" or "attempt."). */
static void add_attempt(vals *v, const char *prefix, const rw_attempt *a) {
  char path[400];
#define P(name) (snprintf(path, sizeof path, "%s%s", prefix, name), path)
  add_uint(v, P("number"), a->number);
  add_str(v, P("upstream"), a->upstream);
  add_bool(v, P("fallback"), a->fallback);
  add_bool(v, P("hedge"), a->hedge);
  add_uint(v, P("remaining_ms"), a->remaining_ms);
  add_uint(v, P("timeouts_ms.connect"), a->connect_timeout_ms);
  add_uint(v, P("timeouts_ms.first_byte"), a->first_byte_timeout_ms);
  add_uint(v, P("timeouts_ms.first_token"), a->first_token_timeout_ms);
  add_uint(v, P("timeouts_ms.idle"), a->idle_timeout_ms);
  add_uint(v, P("timeouts_ms.total"), a->total_timeout_ms);
  rw_str key = {NULL, 0};
  for (size_t i = 0; i < a->headers_len; i++) {
    char *name = xstrndup(a->headers[i].name.ptr, a->headers[i].name.len);
    char hp[300];
    snprintf(hp, sizeof hp, "headers.%s", name);
    add_str(v, P(hp), a->headers[i].value);
    /* rw_attempt has no idempotency_key field: it is the header's value. */
    if (strcmp(name, "idempotency-key") == 0) key = a->headers[i].value;
    free(name);
  }
  add_str(v, P("idempotency_key"), key);
#undef P
}

static void do_next_attempt(run *r, rw_call *c) {
  rw_attempt a;
  memset(&a, 0, sizeof a);
  rw_result rc = rw_call_next_attempt(c, &a);
  r->kind = K_ATTEMPT;
  if (rc == RW_OK) {
    add_attempt(&r->actual, "", &a);
  } else {
    r->got_stop = 1;
    if (rc != RW_STOPPED) mismatch(r, "rw_call_next_attempt", "RW_OK or RW_STOPPED", rw_result_name(rc));
    add_cstr(&r->actual, "stop.reason", rw_reason_name(a.stop_reason));
    add_cstr(&r->actual, "stop.class", class_name(a.stop_class));
    add_cstr(&r->actual, "stop.on_failure", on_failure_name(a.on_failure));
    add_str(&r->actual, "stop.detail", a.detail);
    /* -1: a stop; otherwise "not yet", ask again after wait_ms. */
    if (a.wait_ms < 0) vals_add(&r->actual, "stop.wait_ms", T_NULL);
    else add_uint(&r->actual, "stop.wait_ms", (unsigned long long)a.wait_ms);
  }
}

static void do_next_hedge(run *r, rw_call *c) {
  rw_hedge_plan p;
  memset(&p, 0, sizeof p);
  rw_result rc = rw_call_next_hedge(c, &p);
  if (rc != RW_OK) mismatch(r, "rw_call_next_hedge", "RW_OK", rw_result_name(rc));
  r->kind = K_VALS;
  add_cstr(&r->actual, "action", rw_hedge_action_name(p.action));
  switch (p.action) {
  case RW_HEDGE_ACTION_START: add_attempt(&r->actual, "attempt.", &p.attempt); break;
  case RW_HEDGE_ACTION_AFTER: add_uint(&r->actual, "after_ms", p.after_ms); break;
  default: add_cstr(&r->actual, "reason", rw_reason_name(p.reason)); break;
  }
}

/* A decision's canonical view. */
static void add_decision(run *r, const rw_decision *d) {
  vals *v = &r->actual;
  r->kind = K_VALS;
  add_cstr(v, "action", rw_action_name(d->action));
  add_uint(v, "delay_ms", d->delay_ms);
  add_cstr(v, "class", class_name(d->error_class));
  add_cstr(v, "reason", rw_reason_name(d->reason));
  add_str(v, "upstream", d->upstream);
  add_cstr(v, "wait_source", rw_wait_source_name(d->wait_source));
  if (d->retry_after_ms < 0) vals_add(v, "retry_after_ms", T_NULL);
  else add_uint(v, "retry_after_ms", (unsigned long long)d->retry_after_ms);
  add_cstr(v, "on_failure", on_failure_name(d->on_failure));
  add_str(v, "detail", d->detail);
  add_uint(v, "attempt", d->attempt);
  add_bool(v, "hedge", d->hedge);
  add_cstr(v, "continuation", rw_continuation_name(d->continuation));
  for (size_t i = 0; i < d->excluded_len; i++) {
    char *name = xstrndup(d->excluded[i].name.ptr, d->excluded[i].name.len);
    char path[300];
    snprintf(path, sizeof path, "excluded.%s", name);
    add_str(v, path, d->excluded[i].value);
    free(name);
  }
}

static void do_cancel(run *r, rw_call *c) {
  rw_decision d;
  memset(&d, 0, sizeof d);
  rw_result rc = rw_call_cancel(c, &d);
  if (rc != RW_OK) mismatch(r, "rw_call_cancel", "RW_OK", rw_result_name(rc));
  add_decision(r, &d);
}

static void do_report(run *r, const toks *t, rw_call *c) {
  rw_outcome o = RW_OUTCOME_INIT;
  rw_header hs[32];
  size_t nh = 0;
  int has_attempt = 0;
  uint32_t attempt = 0;
  for (size_t i = 4; i < t->n;) {
    const char *k = t->v[i];
    if (strcmp(k, "header") == 0 && i + 2 < t->n) {
      if (nh < 32) {
        hs[nh].name = S(t->v[i + 1]);
        hs[nh].value = S(t->v[i + 2]);
        nh++;
      }
      i += 3;
      continue;
    }
    if (i + 1 >= t->n) break;
    const char *v = t->v[i + 1];
    int ok = 1;
    if (strcmp(k, "status") == 0) o.status = (uint16_t)strtoul(v, NULL, 10);
    else if (strcmp(k, "error") == 0) o.error_kind = code_of(ERROR_KINDS, v, &ok);
    else if (strcmp(k, "phase") == 0) o.phase = code_of(PHASES, v, &ok);
    else if (strcmp(k, "effect") == 0) o.effect = code_of(EFFECTS, v, &ok);
    else if (strcmp(k, "vendor_code") == 0) o.vendor_code = S(v);
    else if (strcmp(k, "body") == 0) o.body = S(v);
    else if (strcmp(k, "input_tokens") == 0) o.input_tokens = strtoull(v, NULL, 10);
    else if (strcmp(k, "ok") == 0) o.ok = strcmp(v, "1") == 0;
    else if (strcmp(k, "resumable") == 0) o.resumable = strcmp(v, "1") == 0;
    else if (strcmp(k, "continuation") == 0) o.continuation = code_of(CONTINUATIONS, v, &ok);
    else if (strcmp(k, "first_token_ms") == 0) o.first_token_ms = strtoull(v, NULL, 10);
    else if (strcmp(k, "attempt") == 0) {
      has_attempt = 1;
      attempt = (uint32_t)strtoul(v, NULL, 10);
    } else ok = 0;
    if (!ok) mismatch(r, "outcome", "a known field and value", k);
    i += 2;
  }
  o.headers = nh ? hs : NULL;
  o.headers_len = nh;
  rw_decision d;
  memset(&d, 0, sizeof d);
  /* `attempt N`: report that attempt (hedging), else the latest in flight. */
  rw_result rc = has_attempt ? rw_call_report_attempt(c, attempt, &o, &d) : rw_call_report(c, &o, &d);
  if (rc != RW_OK) mismatch(r, has_attempt ? "rw_call_report_attempt" : "rw_call_report", "RW_OK", rw_result_name(rc));
  add_decision(r, &d);
}

static const char *phase_name(rw_phase p) {
  for (const name_code *t = PHASES; t->name; t++)
    if (t->code == (int)p) return t->name;
  return NULL;
}

/* Appends `n` bytes at `p` to the growing buffer `*buf` (`*len` used, `*cap` allocated). */
static void append(char **buf, size_t *len, size_t *cap, const uint8_t *p, size_t n) {
  if (n == 0) return;
  while (*len + n > *cap) *cap *= 2;
  *buf = realloc(*buf, *cap);
  memcpy(*buf + *len, p, n);
  *len += n;
}

/* A stream_gate step: content_type S (absent: none), chunk S (repeated),
 * finish 1 (end the body after the last chunk); the view is what the
 * consumer saw and the phase now. */
static void do_stream_gate(run *r, const toks *t) {
  const char *ct = arg(t, 4, "content_type");
  const char *fin = arg(t, 4, "finish");
  rw_stream_gate *g = rw_stream_gate_new(ct ? S(ct) : (rw_str){NULL, 0});
  if (!g) {
    mismatch(r, "rw_stream_gate_new", "a gate", "NULL");
    return;
  }
  size_t cap = 64, len = 0;
  char *seen = malloc(cap);
  const uint8_t *out;
  size_t out_len;
  for (size_t i = 4; i + 1 < t->n; i += 2) {
    if (strcmp(t->v[i], "chunk") != 0) continue;
    rw_result rc = rw_stream_gate_feed(g, (const uint8_t *)t->v[i + 1], strlen(t->v[i + 1]), &out, &out_len);
    if (rc != RW_OK) mismatch(r, "rw_stream_gate_feed", "RW_OK", rw_result_name(rc));
    else append(&seen, &len, &cap, out, out_len);
  }
  if (fin && strcmp(fin, "1") == 0) {
    rw_result rc = rw_stream_gate_finish(g, &out, &out_len);
    if (rc != RW_OK) mismatch(r, "rw_stream_gate_finish", "RW_OK", rw_result_name(rc));
    else append(&seen, &len, &cap, out, out_len);
  }
  r->kind = K_VALS;
  add_str(&r->actual, "released", (rw_str){seen, len});
  add_cstr(&r->actual, "phase", phase_name(rw_stream_gate_phase(g)));
  free(seen);
  rw_stream_gate_free(g);
}

static void do_step(run *r, const toks *t) {
  /* step LABEL OP CALL ARGS... */
  r->label = xstrdup(t->n > 1 ? t->v[1] : "?");
  const char *op = t->n > 2 ? t->v[2] : "";
  const char *call = t->n > 3 ? t->v[3] : "";
  if (r->broken) return;
  if (strcmp(op, "advance") == 0) {
    const char *ms = arg(t, 4, "ms");
    rw_result rc = rw_engine_advance_clock(r->engine, ms ? strtoull(ms, NULL, 10) : 0);
    if (rc != RW_OK) mismatch(r, "rw_engine_advance_clock", "RW_OK", rw_result_name(rc));
  } else if (strcmp(op, "begin") == 0) {
    do_begin(r, t, call);
  } else if (strcmp(op, "read_request") == 0) {
    do_read_request(r, t);
  } else if (strcmp(op, "next_attempt") == 0 || strcmp(op, "report") == 0 || strcmp(op, "next_hedge") == 0 ||
             strcmp(op, "cancel") == 0) {
    rw_call **slot = call_slot(r, call, 0);
    if (!slot || !*slot) {
      mismatch(r, "call", "a begun call", call);
      return;
    }
    if (strcmp(op, "next_attempt") == 0) do_next_attempt(r, *slot);
    else if (strcmp(op, "next_hedge") == 0) do_next_hedge(r, *slot);
    else if (strcmp(op, "cancel") == 0) do_cancel(r, *slot);
    else do_report(r, t, *slot);
  } else if (strcmp(op, "reload") == 0) {
    const char *pol = arg(t, 4, "policy");
    rw_error *err = NULL;
    rw_result rc = rw_engine_reload(r->engine, pol, pol ? strlen(pol) : 0, &err);
    r->kind = K_VALS;
    add_bool(&r->actual, "ok", rc == RW_OK);
    if (rc != RW_OK) add_cstr(&r->actual, "error", err ? rw_error_message(err) : rw_result_name(rc));
    rw_error_free(err);
  } else if (strcmp(op, "set_mode") == 0) {
    const char *re = arg(t, 4, "retries"), *fb = arg(t, 4, "fallback"), *he = arg(t, 4, "hedging");
    rw_result rc = rw_engine_set_mode(r->engine, !re || strcmp(re, "1") == 0, !fb || strcmp(fb, "1") == 0,
                                      !he || strcmp(he, "1") == 0);
    if (rc != RW_OK) mismatch(r, "rw_engine_set_mode", "RW_OK", rw_result_name(rc));
  } else if (strcmp(op, "stream_gate") == 0) {
    do_stream_gate(r, t);
  } else if (strcmp(op, "stats") == 0) {
    char *json = NULL;
    rw_result rc = rw_engine_stats_json(r->engine, &json);
    if (rc != RW_OK) mismatch(r, "rw_engine_stats_json", "RW_OK", rw_result_name(rc));
    r->kind = K_STATS;
    r->stats_json = json ? xstrdup(json) : NULL;
    rw_string_free(json);
  } else {
    mismatch(r, "op", "a known op", op);
  }
}

static void add_expect(run *r, const toks *t) {
  if (t->n < 4) return;
  if (r->nexp == r->capexp) {
    r->capexp = r->capexp ? r->capexp * 2 : 16;
    r->exp = xrealloc(r->exp, r->capexp * sizeof(expectation));
  }
  expectation *e = &r->exp[r->nexp++];
  memset(e, 0, sizeof *e);
  e->path = xstrdup(t->v[1]);
  const char *ty = t->v[2], *v = t->v[3];
  switch (ty[0]) {
  case 's': e->v.t = T_STR; e->v.s = xstrdup(v); break;
  case 'i':
    e->v.t = T_INT;
    if (v[0] == '-') e->v.i = strtoll(v, NULL, 10);
    else {
      e->v.u = strtoull(v, NULL, 10);
      e->v.i = (long long)e->v.u;
      e->v.is_unsigned = 1;
    }
    break;
  case 'f': e->v.t = T_FLOAT; e->v.f = strtod(v, NULL); break;
  case 'b': e->v.t = T_BOOL; e->v.b = strcmp(v, "1") == 0; break;
  default: e->v.t = T_NULL; break;
  }
}

int main(int argc, char **argv) {
  /* The environment kill switch must not leak into replayed decisions. */
  unsetenv("RETRYWISE_DISABLE");
  FILE *in = stdin;
  if (argc > 1 && strcmp(argv[1], "-") != 0) {
    in = fopen(argv[1], "r");
    if (!in) {
      perror(argv[1]);
      return 2;
    }
  }
  run r;
  memset(&r, 0, sizeof r);
  char *line = NULL;
  size_t cap = 0;
  while (getline(&line, &cap, in) != -1) {
    toks t = split(line);
    if (t.n == 0) {
      toks_free(&t);
      continue;
    }
    const char *kw = t.v[0];
    if (strcmp(kw, "vector") == 0 && t.n > 1) {
      vector_end(&r);
      r.vector = xstrdup(t.v[1]);
      r.vector_mismatches = 0;
      r.broken = 0;
    } else if (strcmp(kw, "skip") == 0 && t.n > 1) {
      /* A known core bug: reported, not run (to_lines.py wrote no steps). */
      printf("vector %s skipped: %s\n", r.vector ? r.vector : "?", t.v[1]);
      r.skipped++;
      r.broken = 1;
    } else if (strcmp(kw, "seed") == 0 && t.n > 1) {
      r.seed = strtoull(t.v[1], NULL, 10);
    } else if (strcmp(kw, "policy") == 0 && t.n > 1) {
      rw_engine_options opts = {.seed = r.seed, .has_seed = true, .manual_clock = true};
      rw_error *err = NULL;
      r.engine = rw_engine_new_with(t.v[1], strlen(t.v[1]), &opts, &err);
      if (!r.engine) {
        mismatch(&r, "engine", "a valid engine", err ? rw_error_message(err) : "NULL");
        r.broken = 1;
      }
      rw_error_free(err);
    } else if (strcmp(kw, "step") == 0) {
      step_check(&r);
      step_reset(&r);
      do_step(&r, &t);
    } else if (strcmp(kw, "expect") == 0) {
      add_expect(&r, &t);
    } else if (strcmp(kw, "within") == 0 && t.n > 2) {
      r.has_within = 1;
      r.within_lo = strtoll(t.v[1], NULL, 10);
      r.within_hi = strtoll(t.v[2], NULL, 10);
    } else if (strcmp(kw, "contains") == 0 && t.n > 1) {
      free(r.contains);
      r.contains = xstrdup(t.v[1]);
    } else if (strcmp(kw, "end") == 0) {
      vector_end(&r);
    } else {
      fprintf(stderr, "bad line: %s", line);
      toks_free(&t);
      free(line);
      return 2;
    }
    toks_free(&t);
  }
  vector_end(&r);
  free(line);
  free(r.exp);
  if (in != stdin) fclose(in);
  printf("c: %d vectors, %d passed, %d failed, %d mismatches, %d skipped\n", r.vectors, r.vectors - r.failed - r.skipped,
         r.failed, r.mismatches, r.skipped);
  return r.mismatches ? 1 : (r.vectors ? 0 : 2);
}
