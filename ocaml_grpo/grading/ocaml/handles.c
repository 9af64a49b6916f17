/* The trusted program's handles on the oracle's values of an abstract type (linked into the
   trusted program only, never into the oracle; oracle.py `handle_runtime` declares them).

   A value of a type the prompt keeps abstract stays in the oracle; the trusted program holds a
   custom block with its number. The tests compare such values with `=`, `compare` and
   `Hashtbl.hash`, directly or deep inside lists, records and hash tables: the runtime's
   polymorphic compare and hash call this block's operations, which ask the oracle to compare or
   hash the values themselves (frames Q and H: wire.ml, `serve_query`). So the tests see what one
   program would: two counters equal when their representations are, a representation holding a
   closure raising `Invalid_argument "compare: functional value"`, one holding nan unordered.

   The runtime calls these operations in the middle of its own traversal, holding pointers into the
   heap that a collection would move: the success path allocates nothing. It writes and reads the
   wire's channels through the runtime's buffered I/O (the same buffers as wire.ml's frames, so the
   wire stays in step) into C buffers. Any other reply (an exception the comparison raised, a
   malformed or unexpected frame, the oracle gone) is handed to OCaml, which raises or ends the run:
   the traversal is abandoned, never resumed. */
#define CAML_NAME_SPACE
#define CAML_INTERNALS
#include <caml/alloc.h>
#include <caml/callback.h>
#include <caml/custom.h>
#include <caml/fail.h>
#include <caml/io.h>
#include <caml/memory.h>
#include <caml/mlvalues.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static struct channel *requests = NULL; /* what the trusted program writes to the oracle */
static struct channel *replies = NULL;  /* what it reads from it */
static value channels[2] = {Val_unit, Val_unit};

#define MAX_REPLY (1 << 20) /* an exception's message; a longer reply breaks the wire */

static void put_int(char *p, int64_t n) {
  uint64_t u = (uint64_t)n;
  for (int i = 0; i < 8; i++) p[i] = (char)((u >> (8 * i)) & 0xff);
}

static int64_t get_int(const char *p) {
  uint64_t u = 0;
  for (int i = 0; i < 8; i++) u |= (uint64_t)(unsigned char)p[i] << (8 * i);
  return (int64_t)u;
}

/* Never returns: OCaml ends the run (wire.ml `fail`: the assertion under way is marked). */
static void broken(void) {
  const value *f = caml_named_value("ocaml_grpo_handle_broken");
  if (f != NULL) caml_callback(*f, Val_unit);
  exit(2);
}

static void send_frame(char kind, const char *payload, int len) {
  char head[32];
  int n = snprintf(head, sizeof head, "%c %d\n", kind, len);
  if (requests == NULL) broken();
  caml_really_putblock(requests, head, n);
  caml_really_putblock(requests, (char *)payload, len);
  caml_flush(requests);
}

/* Reads one whole frame into `buf` (its payload; malloc'd when over `cap`). Returns its kind. */
static char read_frame(char *buf, int cap, char **big, intnat *len) {
  char kind, c, head[32];
  int h = 0;
  *big = NULL;
  if (caml_getblock(replies, &kind, 1) != 1) broken();
  for (;;) {
    if (caml_getblock(replies, &c, 1) != 1) broken();
    if (c == '\n') break;
    if (h >= 24) broken();
    head[h++] = c;
  }
  head[h] = 0;
  if (h < 2 || head[0] != ' ') broken();
  intnat n = 0;
  for (int i = 1; i < h; i++) {
    if (head[i] < '0' || head[i] > '9') broken();
    n = 10 * n + (head[i] - '0');
    if (n > MAX_REPLY) broken();
  }
  char *dst = buf;
  if (n > cap) dst = *big = malloc(n);
  if (dst == NULL) broken();
  if (n > 0 && caml_really_getblock(replies, dst, n) != n) broken();
  *len = n;
  return kind;
}

/* A reply other than the expected value: OCaml raises the exception it carries, or refuses it.
   `big`: the payload's own buffer when it was long, freed once copied. */
static void unexpected(char kind, const char *payload, intnat len, char *big) {
  const value *f = caml_named_value("ocaml_grpo_handle_reply");
  if (f == NULL) broken();
  value s = caml_alloc_initialized_string(len, payload);
  free(big);
  caml_callback2(*f, Val_int((unsigned char)kind), s);
  broken(); /* it returned: not a reply it could raise */
}

static void ask(char kind, const char *query, int qlen, char *answer, int alen) {
  char buf[64], *big;
  intnat len;
  send_frame(kind, query, qlen);
  char k = read_frame(buf, sizeof buf, &big, &len);
  if (k == 'R' && len == alen) {
    memcpy(answer, buf, alen);
    return;
  }
  unexpected(k, big != NULL ? big : buf, len, big);
}

/* A handle's data: the oracle's number for the value, and where the trusted side keeps the classes
   of its parameters where it was read (oracle.py, `handle_runtime`; -1: none). */
#define NUMBER(v) (((intnat *)Data_custom_val(v))[0])
#define CLASSES(v) (((intnat *)Data_custom_val(v))[1])

static int handle_compare(value a, value b) {
  char q[16], ans[9];
  put_int(q, NUMBER(a));
  put_int(q + 8, NUMBER(b));
  ask('Q', q, 16, ans, 9);
  /* ans: the total order's result, then whether <, = or > holds (none: unordered, nan inside) */
  if ((ans[8] & 7) == 0) caml_compare_unordered = 1;
  int64_t c = get_int(ans);
  return c < 0 ? -1 : c > 0 ? 1 : 0;
}

static intnat handle_hash(value a) {
  char q[8], ans[8];
  put_int(q, NUMBER(a));
  ask('H', q, 8, ans, 8);
  return (intnat)get_int(ans);
}

static struct custom_operations handle_ops = {
    "ocaml_grpo.handle", custom_finalize_default, handle_compare, handle_hash,
    custom_serialize_default, custom_deserialize_default, custom_compare_ext_default,
    custom_fixed_length_default};

value ocaml_grpo_handle_make(value n, value classes) {
  CAMLparam2(n, classes);
  CAMLlocal1(v);
  v = caml_alloc_custom(&handle_ops, 2 * sizeof(intnat), 0, 1);
  NUMBER(v) = Long_val(n);
  CLASSES(v) = Long_val(classes);
  CAMLreturn(v);
}

value ocaml_grpo_handle_number(value v) { return Val_long(NUMBER(v)); }

value ocaml_grpo_handle_classes(value v) { return Val_long(CLASSES(v)); }

value ocaml_grpo_handle_init(value out, value in) {
  channels[0] = out;
  channels[1] = in;
  caml_register_generational_global_root(&channels[0]);
  caml_register_generational_global_root(&channels[1]);
  requests = Channel(out);
  replies = Channel(in);
  return Val_unit;
}
