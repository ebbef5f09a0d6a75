;;; magent-store-print-tests.el --- ERT: what the shim writes on the wire  -*- lexical-binding: t; -*-

;; SPDX-License-Identifier: GPL-3.0-or-later

;;; Commentary:

;; A batch is printed once as Lisp text for the backend: strings go as
;; their text only, whatever text properties magent's buffers left on
;; them, wherever in the string those properties start.

;;; Code:

(require 'ert)
(require 'magent-store-print)

(ert-deftest magent-store-print-batch-drops-properties-anywhere-in-a-string ()
  "A chunk whose text properties start past its first character is sent as
plain text, as one with none or one whose properties start at once."
  (dolist (chunk (list "abcd"
                       (concat "ab" (propertize "cd" 'face 'bold))
                       (propertize "abcd" 'face 'bold)))
    (with-temp-buffer
      (magent-store-print-batch (vector "item-1" chunk nil 1.5) 4)
      (should (equal (buffer-string) "((\"item-1\" \"abcd\" nil 1.5) )"))
      (should (equal (car (read (buffer-string))) '("item-1" "abcd" nil 1.5))))))

(provide 'magent-store-print-tests)
;;; magent-store-print-tests.el ends here
