;;; magent-store-readme-tests.el --- ERT: the documented example runs as printed  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; The example of "Using the store from your own code", read from
;; docs/API.md and evaluated as it is against a real backend in a fresh
;; session root; its value must be what the page says it is.

;;; Code:

(require 'cl-lib)
(require 'ert)

(require 'magent-store-test-backend)
(require 'magent-store)

(defconst magent-store-readme-test--file
  (expand-file-name "../../docs/API.md"
                    (file-name-directory (or load-file-name buffer-file-name)))
  "The page whose example is tested.")

(defun magent-store-readme-test--example ()
  "Return (FORMS . EXPECTED) of the documented example block."
  (with-temp-buffer
    (insert-file-contents magent-store-readme-test--file)
    (set-syntax-table emacs-lisp-mode-syntax-table)
    (goto-char (point-min))
    (search-forward ";; Example: store a turn and read it back.")
    (let ((start (line-beginning-position))
          (end (progn (re-search-forward "^```$") (match-beginning 0)))
          forms)
      (goto-char start)
      (while (progn (forward-comment (buffer-size)) (< (point) end))
        (push (read (current-buffer)) forms))
      (goto-char start)
      (re-search-forward "^;; => \\(.*\\)$" end)
      (cons (nreverse forms) (car (read-from-string (match-string 1)))))))

(ert-deftest magent-store-readme-example-runs-as-printed ()
  (let ((example (magent-store-readme-test--example)))
    (should (equal (cdr example) "Hello, world"))
    (magent-store-test-with-backend ()
      (let (value)
        (dolist (form (car example))
          (setq value (eval form t)))
        (should (equal value (cdr example)))
        ;; It really went to disk, under the session root.
        (should (file-exists-p (expand-file-name "global/example-session.jsonl"
                                                 magent-store-root)))))))

(ert-deftest magent-store-api-page-names-only-what-is-defined ()
  "Every function and variable docs/API.md names exists, documented."
  (require 'magent-store-timing)
  (let (undocumented (seen 0))
    (with-temp-buffer
      (insert-file-contents magent-store-readme-test--file)
      (goto-char (point-min))
      (while (re-search-forward "`(?\\(magent-store-[a-z0-9-]*[a-z0-9]\\)\\([^.a-z0-9-]\\)"
                                nil t)
        (let ((symbol (intern (match-string 1))))
          (cl-incf seen)
          (unless (or (get symbol 'error-conditions)
                      (and (fboundp symbol) (documentation symbol))
                      (and (boundp symbol)
                           (documentation-property symbol 'variable-documentation)))
            (push symbol undocumented)))))
    (should (> seen 40))
    (should-not (delete-dups undocumented))))

(provide 'magent-store-readme-tests)
;;; magent-store-readme-tests.el ends here
