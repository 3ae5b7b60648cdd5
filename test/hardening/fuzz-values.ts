// The schema-driven fuzzer's moves: from one valid message and its valibot schema, every
// field mistyped (a value of each other JSON type, and a few edge values), every field missing,
// and an extra field; whole-message garbage besides. Which variants the schema accepts is read
// from the schema itself, so the test can say what each should get.

import * as v from 'valibot';

export interface Variant {
  label: string;
  /** the message as sent (JSON) */
  message: unknown;
  /** the field changed, for "the error names it" */
  field: string | null;
  /** whether the schema accepts it */
  valid: boolean;
}

/** Values of every JSON type, and edges: what a careless or hostile sender puts in a field. */
export const ODD_VALUES: unknown[] = [null, 0, -1, 1.5, 2 ** 53, 1e308, 'x', '', 'a'.repeat(5000), true, [], [1, 'x'], {}, { nested: { deep: [null] } }];

/** Whole-message garbage. */
export const GARBAGE: unknown[] = [null, 5, 'hello', true, [], [{ t: 'hello' }], {}, { t: 5 }, { t: null }, { t: 'no-such-type' }, { t: ['hello'] }];

type ObjectLike = { entries: Record<string, v.GenericSchema> };

function entriesOf(schema: v.GenericSchema): Record<string, v.GenericSchema> {
  const e = (schema as unknown as Partial<ObjectLike>).entries;
  if (!e) throw new Error(`schema ${schema.type} has no entries`);
  return e;
}

export function isOptional(field: v.GenericSchema): boolean {
  return field.type === 'optional' || field.type === 'nullish' || field.type === 'undefinedable';
}

/** Every single-field variant of `valid` under `schema` (the literal `t` included). */
export function variantsOf(schema: v.GenericSchema, valid: Record<string, unknown>): Variant[] {
  const out: Variant[] = [];
  const check = (m: unknown): boolean => v.safeParse(schema, m).success;
  if (!check(valid)) throw new Error(`the fixture is not valid: ${JSON.stringify(v.safeParse(schema, valid).issues?.[0]?.message)}`);
  for (const field of Object.keys(entriesOf(schema))) {
    for (const odd of ODD_VALUES) {
      const m = { ...valid, [field]: odd };
      out.push({ label: `${field} = ${JSON.stringify(odd).slice(0, 30)}`, message: m, field, valid: check(m) });
    }
    const { [field]: _dropped, ...missing } = valid;
    out.push({ label: `${field} missing`, message: missing, field, valid: check(missing) });
  }
  const extra = { ...valid, extraField: { injected: true } };
  out.push({ label: 'an extra field', message: JSON.parse(JSON.stringify(extra)), field: null, valid: check(extra) });
  return out;
}
