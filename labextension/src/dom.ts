/** Building the panel's DOM: one element factory, so every view reads as its structure. */

type Child = Node | string | null | undefined | false;

/**
 * An element with attributes (`on*` functions become listeners; `false`/`null`/`undefined`
 * values are left out) and children (strings become text, falsy ones are skipped).
 */
export function h<K extends keyof HTMLElementTagNameMap>(
  tag: K,
  attrs: Record<string, unknown> = {},
  ...children: (Child | Child[])[]
): HTMLElementTagNameMap[K] {
  const el = document.createElement(tag);
  setAttributes(el, attrs);
  append(el, children);
  return el;
}

const SVG_NS = 'http://www.w3.org/2000/svg';

/** An SVG element, as `h` makes HTML ones. */
export function svg(
  tag: string,
  attrs: Record<string, unknown> = {},
  ...children: (Child | Child[])[]
): SVGElement {
  const el = document.createElementNS(SVG_NS, tag) as SVGElement;
  setAttributes(el, attrs);
  append(el, children);
  return el;
}

function setAttributes(el: Element, attrs: Record<string, unknown>): void {
  for (const [name, value] of Object.entries(attrs)) {
    if (value === false || value === null || value === undefined) {
      continue;
    }
    if (name.startsWith('on') && typeof value === 'function') {
      el.addEventListener(name.slice(2), value as EventListener);
    } else {
      el.setAttribute(name, value === true ? '' : String(value));
    }
  }
}

function append(el: Element, children: (Child | Child[])[]): void {
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) {
      continue;
    }
    el.append(typeof child === 'string' ? document.createTextNode(child) : child);
  }
}
