// Keeps each word of the inline code in a table on one line (see stylesheets/extra.css): a browser may break a
// line after a hyphen, which splits flags such as --n-step; the spaces between words remain places to break.
document.addEventListener("DOMContentLoaded", function () {
  document.querySelectorAll(".md-typeset table:not([class]) code").forEach(function (code) {
    if (code.children.length > 0) {
      return; // code with markup of its own (highlighted) is left as it is
    }
    const parts = code.textContent.split(/(\s+)/);
    code.textContent = "";
    parts.forEach(function (part) {
      if (part === "" || /^\s+$/.test(part)) {
        code.appendChild(document.createTextNode(part));
        return;
      }
      const word = document.createElement("span");
      word.className = "code-word";
      word.textContent = part;
      code.appendChild(word);
    });
  });
});
